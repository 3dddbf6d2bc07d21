"""The authority events: what the journal records about agents, grants and fan-outs.

Streams: everything that changes what an agent may still do is on that agent's stream
(``agent:root``, ``agent:root/sa-3``), so an append pinned to the version a decision was
taken on fails if anything changed since. Refusals are standalone facts.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from charter.authority._fast import construct
from charter.authority._gate import Verdict
from charter.authority._grant import Hex32
from charter.authority._seal import SealedGrant
from charter.authority.errors import GrantFormatError
from charter.core.budget import Budget
from charter.core.events import Event
from charter.core.lineage import Lineage

__all__ = ["AgentRegistered", "GrantMinted", "GateDecided", "LineageRevoked", "SpawnRefused"]

_Hex64Bytes = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{128}$")]


class AgentRegistered(Event):
    """A durable agent joined the directory with its Ed25519 trust root (public key)."""

    type_name = "AgentRegistered"

    name: str
    lineage: Lineage
    trust_root: Hex32

    def stream(self) -> str:
        return str(self.lineage)


class GrantMinted(Event):
    """A sealed grant, exactly as signed: ``body`` is the canonical text, ``signature``
    the issuer's Ed25519 signature in hex. A root's ceiling grant is self-issued."""

    type_name = "GrantMinted"

    fanout: str = Field(description="The fan-out (or registration) this grant belongs to.")
    lineage: Lineage
    issuer: Lineage
    body: str
    signature: _Hex64Bytes

    def stream(self) -> str:
        return str(self.issuer)

    def sealed(self) -> SealedGrant:
        """Parse and check the stored grant; its lineage and issuer must match ours."""
        sealed = SealedGrant.from_record({"body": self.body, "signature": self.signature})
        if sealed.grant.lineage != self.lineage or sealed.grant.issuer != self.issuer:
            raise GrantFormatError(
                f"journaled grant for {self.lineage} holds a grant for {sealed.grant.lineage}"
            )
        return sealed

    @classmethod
    def of(cls, fanout: str, sealed: SealedGrant) -> GrantMinted:
        grant = sealed.grant
        values = {
            "fanout": fanout,
            "lineage": grant.lineage,
            "issuer": grant.issuer,
            "body": sealed.body.decode("utf-8"),
            "signature": sealed.signature.hex(),
        }
        return construct(cls, values)


class GateDecided(Event):
    """The gate's verdict on one fan-out (journaled for every verdict)."""

    type_name = "GateDecided"

    fanout: str
    actor: Lineage
    width: int
    objective: str
    estimated_cost: Budget
    verdict: Verdict
    reason: str
    policy: str

    def stream(self) -> str:
        return str(self.actor)


class SpawnRefused(Event):
    """A fan-out that did not happen, and why (``reason`` is the error's stable code)."""

    type_name = "SpawnRefused"

    fanout: str
    actor: str = Field(description="The resolved parent, or what the caller claimed.")
    reason: str
    error: str
    message: str
    width: int
    objective: str


class LineageRevoked(Event):
    """``lineage`` and its whole subtree are revoked from this position on: none of them
    may spawn, be admitted or start, and the cell kills what of them runs (each kill
    journaled first; its measured usage is charged before its lease returns).

    On the lineage's stream: a fan-out anywhere below pins every ancestor's stream, so
    one decided before the revocation cannot commit after it."""

    type_name = "LineageRevoked"

    lineage: Lineage
    reason: str = Field(max_length=1000)

    def stream(self) -> str:
        return str(self.lineage)
