"""The fan-out decision: a pure function from the parent's state and an intent to events.

``decide`` runs nothing and reads nothing: the caller resolves the parent (server side),
passes the gate policy in, and appends the returned events in one transaction. Grants
are handed out only after that append commits (see charter.control.spawn). Later stages (budget
leases, admission) add their events to the same :class:`FanoutDecision` before the
append, so a fan-out stays one atomic entry in the journal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from nacl.signing import SigningKey

from charter.authority._fast import construct
from charter.authority._gate import GateDecision, GatePolicy, GateQuestion, Verdict, ask_gate
from charter.authority._grant import Grant, GrantTerms, attenuate, check_invariants
from charter.authority._intent import RequestedGrant, SpawnIntent
from charter.authority._seal import SealedGrant, Signer, derive_child_seed
from charter.authority._trifecta import TrifectaPolicy, check_trifecta
from charter.authority.errors import (
    AuthorityRefusedError,
    DepthExhaustedError,
    FanoutExhaustedError,
    GateRefusedError,
    GateUnknownError,
    GrantExpiredError,
)
from charter.authority.events import GateDecided, GrantMinted, SpawnRefused
from charter.core.errors import RefusedError
from charter.core.events import Event
from charter.core.lineage import Lineage

__all__ = [
    "AttenuateFn",
    "FanoutCommand",
    "FanoutDecision",
    "MintedChild",
    "ParentState",
    "decide",
    "refusal_event",
]


# The attenuation step: ``attenuate`` unless a test swaps in a broken one to show that
# the invariant checks do not trust it.
AttenuateFn = Callable[..., GrantTerms]


@dataclass(frozen=True)
class ParentState:
    """The parent as resolved on the server side, and what the journal says it has done.

    ``custody_seed`` is the parent's custody key (checked against its trust root before
    this is built); ``minted`` is how many children it has minted (they are numbered
    after it); ``reserved`` is how much of its fan-out allowance they hold (each child
    one, plus its own allowance); ``version`` is its
    stream's version, which the append is pinned to.
    """

    sealed: SealedGrant
    custody_seed: bytes = field(repr=False)
    minted: int
    reserved: int
    version: int

    @cached_property
    def custody(self) -> Signer:
        """The custody key in signing form (derived from the seed: one key, not two)."""
        return Signer(self.custody_seed)

    @property
    def lineage(self) -> Lineage:
        return self.sealed.grant.lineage

    @property
    def remaining_fanout(self) -> int:
        return self.sealed.grant.terms.fanout - self.reserved


@dataclass(frozen=True)
class FanoutCommand:
    """One fan-out request: an id for the journal, the intent, and the decision time."""

    fanout_id: str
    intent: SpawnIntent
    now_ms: int


@dataclass(frozen=True)
class MintedChild:
    """A minted worker: its sealed grant and (for the key broker) its custody-key seed.

    ``grant`` is the sealed grant's parsed form, kept as a plain field: later stages of
    a 1000-wide fan-out read it per child, and the sealed grant's private attribute is
    slow to reach through pydantic.
    """

    sealed: SealedGrant
    seed: bytes = field(repr=False)
    grant: Grant = field(repr=False)

    @property
    def lineage(self) -> Lineage:
        return self.grant.lineage

    def custody_key(self) -> SigningKey:
        return SigningKey(self.seed)


@dataclass(frozen=True)
class FanoutDecision:
    """The events to append, the stream versions they were decided on, and the outcome.

    ``refusal`` is set when the fan-out is refused: the events then record the refusal
    and ``children`` is empty.
    """

    fanout_id: str
    parent: Lineage
    events: tuple[Event, ...]
    expect: dict[str, int]
    gate: GateDecision | None = None
    children: tuple[MintedChild, ...] = ()
    refusal: RefusedError | None = None

    def joined(
        self, more: tuple[Event, ...], expect: dict[str, int] | None = None
    ) -> FanoutDecision:
        """The same decision with more events in the same append (leases, admission),
        pinned to the extra stream versions they were decided on."""
        return FanoutDecision(
            self.fanout_id,
            self.parent,
            self.events + more,
            {**self.expect, **(expect or {})},
            self.gate,
            self.children,
            self.refusal,
        )

    def refused(self, error: RefusedError, actor: str, intent: SpawnIntent) -> FanoutDecision:
        """The fan-out refused by a later stage: the gate's record and the refusal are
        journaled, nothing is minted."""
        gate_events = tuple(e for e in self.events if isinstance(e, GateDecided))
        event = refusal_event(
            self.fanout_id, actor, error, width=intent.width, objective=intent.objective
        )
        return FanoutDecision(
            self.fanout_id, self.parent, (*gate_events, event), {}, self.gate, refusal=error
        )


def refusal_event(
    fanout_id: str, actor: str, error: RefusedError, *, width: int, objective: str
) -> SpawnRefused:
    """The journal record of a refusal: the error's stable reason code and message."""
    return SpawnRefused(
        fanout=fanout_id,
        actor=actor,
        reason=error.reason,
        error=type(error).__name__,
        message=str(error),
        width=width,
        objective=objective,
    )


def _refused(
    state: ParentState,
    command: FanoutCommand,
    error: RefusedError,
    *,
    gate: GateDecision | None = None,
    before: tuple[Event, ...] = (),
) -> FanoutDecision:
    undecided = FanoutDecision(command.fanout_id, state.lineage, before, {}, gate=gate)
    return undecided.refused(error, str(state.lineage), command.intent)


def decide(
    state: ParentState,
    command: FanoutCommand,
    *,
    policy: GatePolicy,
    attenuate_fn: AttenuateFn = attenuate,
    trifecta: TrifectaPolicy | None = None,
) -> FanoutDecision:
    """Decide one fan-out: structural checks, the gate (once), then ``width`` mints.

    Every child is ``requested ∩ parent`` and is checked against the parent, invariant
    by invariant, before it is signed with the parent's custody key. With ``trifecta``
    (the operator's policy: every :class:`charter.app.Charter` passes its home's), a
    child that would hold the lethal trifecta is refused (``lethal-trifecta``) unless
    the policy names it.
    """
    intent, now_ms, parent = command.intent, command.now_ms, state.sealed.grant
    terms = parent.terms
    if terms.expires_at_ms <= now_ms:
        return _refused(
            state,
            command,
            GrantExpiredError(
                f"{parent.lineage}'s grant expired at {terms.expires_at_ms} ms; an expired "
                "grant cannot spawn"
            ),
        )
    if terms.depth == 0:
        return _refused(
            state,
            command,
            DepthExhaustedError(
                f"{parent.lineage} has depth 0 remaining and may not spawn; do the work "
                "itself or ask its parent to spawn"
            ),
        )
    remaining = state.remaining_fanout
    if intent.width > remaining:
        return _refused(
            state,
            command,
            FanoutExhaustedError(
                f"a fan-out of {intent.width} is wider than the {remaining} children "
                f"{parent.lineage} may still spawn (of {terms.fanout})"
            ),
        )

    first = state.minted + 1
    lineages = [parent.lineage.child(str(n)) for n in range(first, first + intent.width)]
    question = GateQuestion(
        actor=parent.lineage,
        affected=(*parent.lineage.ancestors(), *lineages),
        width=intent.width,
        objective=intent.objective,
        estimated_cost=intent.estimated_cost,
        actor_ceiling=terms.budget,
    )
    gate = ask_gate(policy, question)
    gate_event = GateDecided(
        fanout=command.fanout_id,
        actor=parent.lineage,
        width=intent.width,
        objective=intent.objective,
        estimated_cost=intent.estimated_cost,
        verdict=gate.verdict,
        reason=gate.reason,
        policy=gate.policy,
    )
    if not gate.verdict.allows:
        error_type = GateRefusedError if gate.verdict is Verdict.NEGATIVE else GateUnknownError
        error = error_type(
            f"the gate ({gate.policy}) judged this fan-out {gate.verdict}: {gate.reason}"
        )
        return _refused(state, command, error, gate=gate, before=(gate_event,))

    requested: RequestedGrant = intent.grant
    child_terms = attenuate_fn(
        terms,
        requested,
        remaining_fanout=remaining,
        width=intent.width,
        now_ms=now_ms,
        lease=intent.estimated_cost.split(intent.width),
    )
    digest = state.sealed.digest.hex()
    children: list[MintedChild] = []
    mints: list[Event] = []
    try:
        # One attenuation gives every child of this fan-out the same terms, so the
        # invariants are checked once, on those terms, before anything is signed.
        check_invariants(terms, child_terms, remaining_fanout=remaining, width=intent.width)
        if trifecta is not None:  # the children share their terms: checked once
            check_trifecta(lineages[0], child_terms.egress, child_terms.secrets, trifecta)
        sibling: dict[str, Any] | None = None
        for lineage in lineages:
            seed = derive_child_seed(state.custody_seed, lineage)
            subject_key = Signer(seed).public.hex()
            if sibling is None:
                # The first child is validated in full (every field, every cross-field
                # rule). Its siblings differ only in lineage (validated by Lineage.child,
                # same parent and depth) and subject key (64 hex digits by construction),
                # so they reuse its checked fields; this saves ~25 µs per child.
                grant = Grant(
                    lineage=lineage,
                    issuer=parent.lineage,
                    subject_key=subject_key,
                    parent_digest=digest,
                    issued_at_ms=now_ms,
                    terms=child_terms,
                )
                sibling = {name: getattr(grant, name) for name in Grant.model_fields}
            else:
                values = sibling | {"lineage": lineage, "subject_key": subject_key}
                grant = construct(Grant, values)
            sealed = state.custody.seal(grant)
            children.append(MintedChild(sealed, seed, grant))
            mints.append(GrantMinted.of(command.fanout_id, sealed))
    except AuthorityRefusedError as error:
        return _refused(state, command, error, gate=gate, before=(gate_event,))
    return FanoutDecision(
        command.fanout_id,
        parent.lineage,
        (gate_event, *mints),
        {str(parent.lineage): state.version},
        gate=gate,
        children=tuple(children),
    )
