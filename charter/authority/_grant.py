"""Grants: the terms (one value per axis), attenuation, and the invariant checks.

``attenuate`` computes child = requested ∩ parent axis by axis; ``check_invariants``
then checks the result against the parent without trusting ``attenuate``: each
invariant is an explicit comparison with its own named error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from charter.authority._axes import (
    Clearance,
    Destination,
    PermissionMode,
    SecretName,
    ToolName,
    egress_meet,
    egress_within,
    minimal,
    set_meet,
    set_within,
)
from charter.authority._intent import MAX_FANOUT, RequestedGrant
from charter.authority.errors import (
    AxisWidenedError,
    ClearanceRaisedError,
    DepthNotDecreasingError,
    FanoutNotDecreasingError,
    GrantFormatError,
    PermissionModeRaisedError,
)
from charter.core.budget import INT64_MAX, Budget
from charter.core.events import canonical_json
from charter.core.lineage import MAX_LINEAGE_DEPTH, Lineage

__all__ = ["GrantTerms", "Grant", "Hex32", "attenuate", "check_invariants"]

Hex32 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class GrantTerms(BaseModel):
    """One value on every axis: what a holder may do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tools: frozenset[ToolName]
    egress: frozenset[Destination]
    secrets: frozenset[SecretName]
    clearance: Clearance
    mode: PermissionMode
    depth: int = Field(ge=0, le=MAX_LINEAGE_DEPTH)
    fanout: int = Field(ge=0, le=MAX_FANOUT)
    budget: Budget
    expires_at_ms: int = Field(ge=0, le=INT64_MAX)

    @field_validator("egress")
    @classmethod
    def _minimal_egress(cls, value: frozenset[str]) -> frozenset[str]:
        """One rule per host: entries covered by another entry are dropped, so equal
        authority has one spelling (``{"*.d", "a.d"}`` is stored as ``{"*.d"}``)."""
        return minimal(value)

    @cached_property
    def canonical(self) -> dict[str, Any]:
        """The JSON form with every set sorted, so equal terms encode to equal bytes."""
        return {
            "tools": sorted(self.tools),
            "egress": sorted(self.egress),
            "secrets": sorted(self.secrets),
            "clearance": self.clearance.value,
            "mode": self.mode.value,
            "depth": self.depth,
            "fanout": self.fanout,
            "budget": self.budget.model_dump(),
            "expires_at_ms": self.expires_at_ms,
        }

    @cached_property
    def canonical_bytes(self) -> bytes:
        return canonical_json(self.canonical)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A validated copy; the cached encodings are never carried over (they would
        describe the original, and a signature over them would sign the wrong terms)."""
        values = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self)(**(values | dict(update or {})))


class Grant(BaseModel):
    """Who holds the terms (``lineage``, ``subject_key``), who issued them, and from what.

    A root's ceiling grant is self-issued (``issuer == lineage``, no parent digest); a
    child's issuer is its lineage's parent and ``parent_digest`` names the sealed grant
    it was attenuated from, so a chain cannot be spliced from other grants.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    lineage: Lineage
    issuer: Lineage
    subject_key: Hex32
    parent_digest: Hex32 | None
    issued_at_ms: int = Field(ge=0, le=INT64_MAX)
    terms: GrantTerms

    @model_validator(mode="after")
    def _linked(self) -> Grant:
        if self.lineage.is_root:
            if self.issuer != self.lineage or self.parent_digest is not None:
                raise ValueError("a root grant is issued by the root itself, with no parent")
        elif self.issuer != self.lineage.parent or self.parent_digest is None:
            raise ValueError(
                f"grant for {self.lineage} must be issued by its parent {self.lineage.parent} "
                "and name the parent grant's digest"
            )
        if self.lineage.depth + self.terms.depth > MAX_LINEAGE_DEPTH:
            raise ValueError(
                f"depth {self.terms.depth} at level {self.lineage.depth} would exceed the "
                f"deepest lineage ({MAX_LINEAGE_DEPTH} levels)"
            )
        if self.terms.expires_at_ms < self.issued_at_ms:
            raise ValueError("a grant may not expire before it is issued")
        return self

    def canonical_dict(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "lineage": str(self.lineage),
            "issuer": str(self.issuer),
            "subject_key": self.subject_key,
            "parent_digest": self.parent_digest,
            "issued_at_ms": self.issued_at_ms,
            "terms": self.terms.canonical,
        }

    def canonical_body(self) -> bytes:
        """The one canonical encoding (``canonical_json`` of :meth:`canonical_dict`):
        these are the bytes that are signed and stored.

        Composed from the terms' encoding, cached once per terms object, because the
        children of one fan-out share their terms; the keys are spelled in sorted order
        and every value is ASCII by validation, so the bytes equal ``canonical_json``'s
        (a property test holds the two to each other).
        """
        parent = "null" if self.parent_digest is None else f'"{self.parent_digest}"'
        return (
            (
                f'{{"issued_at_ms":{self.issued_at_ms},"issuer":"{self.issuer}",'
                f'"lineage":"{self.lineage}","parent_digest":{parent},'
                f'"subject_key":"{self.subject_key}","terms":'
            ).encode()
            + self.terms.canonical_bytes
            + f',"v":{self.v}}}'.encode()
        )

    @classmethod
    def from_body(cls, body: bytes) -> Grant:
        """Parse stored bytes; refuses anything that is not the canonical encoding."""
        try:
            grant = cls.model_validate(json.loads(body))
        except (ValueError, ValidationError) as e:
            raise GrantFormatError(f"not a Charter grant: {e}") from e
        if grant.canonical_body() != body:
            raise GrantFormatError(
                "grant bytes are not in canonical form (sorted keys and sets, no spaces); "
                "a grant must be stored exactly as it was signed"
            )
        return grant


def attenuate(
    parent: GrantTerms,
    requested: RequestedGrant,
    *,
    remaining_fanout: int,
    width: int,
    now_ms: int,
    lease: Budget | None = None,
) -> GrantTerms:
    """child = requested ∩ parent, axis by axis (an omitted axis asks for the parent's).

    Depth is capped below the parent's (``parent.depth - 1``). Fan-out bounds a whole
    subtree: the parent's remaining allowance pays for the ``width`` children and for
    each child's own allowance, so a child gets at most ``(remaining - width) // width``,
    and only what its intent asks for (none if it asks for none: like a lease, an
    allowance is carved out on request, never handed down whole).
    With ``lease`` (the child's share of the fan-out's estimate), the grant *is* the
    lease: its budget is at most the share, and it expires when the share's wall-clock
    time is up, so the sealed chain narrows to what was actually leased.
    """

    def pick_set(req: frozenset[str] | None, par: frozenset[str]) -> frozenset[str]:
        return par if req is None else set_meet(req, par)

    depth_cap = parent.depth - 1
    fanout_cap = (remaining_fanout - width) // width
    expires = parent.expires_at_ms
    if requested.ttl_s is not None:
        expires = min(expires, now_ms + requested.ttl_s * 1000)
    budget = parent.budget if requested.budget is None else requested.budget.minimum(parent.budget)
    if lease is not None:
        budget = budget.minimum(lease)
        expires = min(expires, now_ms + budget.wall_ms)
    return GrantTerms(
        tools=pick_set(requested.tools, parent.tools),
        egress=parent.egress
        if requested.egress is None
        else egress_meet(requested.egress, parent.egress),
        secrets=pick_set(requested.secrets, parent.secrets),
        clearance=parent.clearance
        if requested.clearance is None
        else requested.clearance.meet(parent.clearance),
        mode=parent.mode if requested.mode is None else requested.mode.meet(parent.mode),
        depth=depth_cap if requested.depth is None else min(requested.depth, depth_cap),
        fanout=0 if requested.fanout is None else min(requested.fanout, fanout_cap),
        budget=budget,
        expires_at_ms=expires,
    )


def check_invariants(
    parent: GrantTerms, child: GrantTerms, *, remaining_fanout: int, width: int = 1
) -> None:
    """Raise the named error of the first invariant ``child`` breaks against ``parent``.

    ``remaining_fanout`` is what the parent may still spawn before this fan-out (for a
    chain checked offline, the parent grant's own fan-out): ``width`` children, each
    with this child's allowance, must fit in it.
    """
    if child.depth >= parent.depth:
        raise DepthNotDecreasingError(
            f"child depth {child.depth} is not below its parent's {parent.depth}; "
            "every spawn must use up a level"
        )
    widened = [
        name
        for name, ok in (
            ("tools", set_within(child.tools, parent.tools)),
            ("egress", egress_within(child.egress, parent.egress)),
            ("secrets", set_within(child.secrets, parent.secrets)),
            ("budget", child.budget.fits_within(parent.budget)),
            ("expiry", child.expires_at_ms <= parent.expires_at_ms),
        )
        if not ok
    ]
    if widened:
        raise AxisWidenedError(
            f"child would hold more than its parent on {', '.join(widened)}; a child's "
            "authority must lie within its parent's on every axis"
        )
    if not child.clearance.within(parent.clearance):
        raise ClearanceRaisedError(
            f"child clearance {child.clearance.value!r} is above its parent's "
            f"{parent.clearance.value!r}; clearance never rises down the tree"
        )
    if not child.mode.within(parent.mode):
        raise PermissionModeRaisedError(
            f"child permission mode {child.mode.value!r} is more permissive than its "
            f"parent's {parent.mode.value!r}"
        )
    if width * (1 + child.fanout) > remaining_fanout:
        raise FanoutNotDecreasingError(
            f"{width} child(ren) with a fan-out of {child.fanout} each need "
            f"{width * (1 + child.fanout)} of the parent's remaining {remaining_fanout}; "
            "a fan-out bounds its whole subtree"
        )
