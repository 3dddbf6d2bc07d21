"""The spawn pipeline: one fan-out, from what the caller holds to grants handed out.

Its stages are named, typed and required, and run in this order in :meth:`spawn`:

1. **resolve**  the parent from the caller's sealed chain and custody key (server side;
   the intent carries no identity), re-verified from the signed bytes;
2. **gate**     asked once per fan-out (in :func:`charter.authority.decide`);
3. **mint**     ``width`` children, each ``requested ∩ parent`` with every invariant checked;
4. **leases**   each child's budget carved out of the parent's remainder (fail closed);
4a. **schedule** with workers named, what each child runs (``WorkerScheduled``);
5. **admission** each child admitted to a slot of its cell, or queued (never over a cap);
6. **ceilings** the fabric's population and depth ceilings (FAILS OPEN on a registry
   read error, journaled as ``CeilingCheckFailedOpen``; DESIGN §5); under a configured
   population ceiling, the fan-out's ``PopulationGrew`` on the fabric-wide stream,
   pinned to the version its count was read at.

Everything a fan-out decides goes to the journal in one append pinned to the streams
it read; grants are handed out only after that append commits. A refusal at any stage
is journaled (with the gate's record, when the gate was asked) and raised.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from nacl.signing import SigningKey
from pydantic import ValidationError

from charter.authority import (
    CostBenefitPolicy,
    FanoutCommand,
    FanoutDecision,
    GateDecided,
    GateDecision,
    GatePolicy,
    GateQuestion,
    GrantChainBrokenError,
    GrantNotJournaledError,
    LineageRevokedError,
    MintedChild,
    ParentState,
    RequestedGrant,
    SealedGrant,
    SpawnIntent,
    TrifectaPolicy,
    UnknownParentError,
    ask_gate,
    check_custody,
    decide,
    refusal_event,
    verify_grant_chain,
)
from charter.authority.errors import AuthorityRefusedError
from charter.budgets import (
    POPULATION_STREAM,
    CapInputs,
    CeilingCheckFailedOpen,
    CellState,
    FabricCeilings,
    PopulationGrew,
    RegistryFacts,
    ResourceClass,
    SlotAdmitted,
    SlotQueued,
    check_ceilings,
)
from charter.control.delegation import (
    DelegationRefused,
    DelegationRequested,
    DelegationView,
)
from charter.control.directory import AgentRecord, custody_key_name
from charter.control.errors import NestedDelegationError, NoCellOfClassError, NotOwnSandboxError
from charter.control.handler import Pinned, StreamsGrewError, append_pinned
from charter.control.load import HostLoad, host_cap_inputs, steady_load
from charter.control.placement import Ask, CellRoom, place
from charter.control.resources import Settling
from charter.control.views import Views
from charter.control.workers import (
    WorkerScheduled,
    WorkerSpec,
    cellrun_stream,
    task_class_of,
    worker_stream,
)
from charter.core import (
    BadInputError,
    CharterError,
    Clock,
    Event,
    InternalError,
    KeyStore,
    Lineage,
    RefusedError,
    describe_invalid,
    now_ms,
)
from charter.ledger import AppendConflictError, AppendFailedError, DeadlinePassedError, Journal

__all__ = [
    "DEFAULT_CELL",
    "Caller",
    "RegistryRead",
    "SpawnResult",
    "SpawnService",
    "host_cap_inputs",
    "steady_load",
]

DEFAULT_CELL = "local"

RegistryRead = Callable[[], RegistryFacts]
"""Reads the registry for the ceilings stage; may raise (the stage then fails open)."""


@dataclass(frozen=True)
class Caller:
    """What a caller holds: its chain of sealed grants (root first) and its custody key.

    For a durable agent the chain is its ceiling grant alone; for a worker, the chain
    from its root down to its own grant (the key broker holds its key).
    """

    chain: tuple[SealedGrant, ...]
    custody_key: SigningKey

    @property
    def claimed(self) -> str:
        return str(self.chain[-1].grant.lineage) if self.chain else "unknown"

    def child(self, minted: MintedChild) -> Caller:
        """The caller a minted worker becomes (Python API; the key broker in production)."""
        return Caller((*self.chain, minted.sealed), minted.custody_key())


@dataclass(frozen=True)
class SpawnResult:
    """A committed fan-out: handed out only after its append committed."""

    fanout_id: str
    parent: Lineage
    gate: GateDecision
    children: tuple[MintedChild, ...]
    positions: tuple[int, int]
    admitted: tuple[str, ...] = ()
    queued: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "fanout": self.fanout_id,
            "parent": str(self.parent),
            "gate": self.gate.model_dump(mode="json"),
            "positions": list(self.positions),
            "children": [str(c.lineage) for c in self.children],
            "admitted": list(self.admitted),
            "queued": list(self.queued),
        }


@dataclass(frozen=True)
class _Payer:
    """Who pays a delegation: the calling worker, whose remainder its delegate's lease
    is carved out of (its chain is verified and pinned like the parent's)."""

    caller: Caller
    agent: str


class _AskedOnce:
    """The gate of one fan-out: the policy is asked at the first attempt, and a retry
    after an append conflict carries that verdict instead of asking again."""

    def __init__(self, policy: GatePolicy) -> None:
        self.policy = policy
        self.name = str(getattr(policy, "name", type(policy).__name__))
        self.decision: GateDecision | None = None

    def judge(self, question: GateQuestion) -> GateDecision:
        if self.decision is None:
            self.decision = ask_gate(self.policy, question)
        return self.decision


def _delegation_requested(decision: FanoutDecision, payer: _Payer) -> FanoutDecision:
    """The delegation's record, joined before its reservation (nothing if refused)."""
    if decision.refusal is not None:
        return decision
    (child,) = decision.children
    requested = DelegationRequested(
        fanout=decision.fanout_id,
        caller=payer.caller.claimed,
        agent=payer.agent,
        delegate=str(child.lineage),
        reserved=child.grant.terms.budget,
    )
    return decision.joined((requested,))


def _delegation_refused(caller: str, agent: str, error: RefusedError) -> DelegationRefused:
    return DelegationRefused(
        caller=caller,
        agent=agent,
        reason=error.reason,
        error=type(error).__name__,
        message=str(error)[:2000],
    )


def _chain_streams(claimed: str) -> list[str]:
    """The streams of ``claimed`` and of each of its ancestors (none if it is not a
    lineage: resolving the caller refuses it then, journaled)."""
    try:
        lineage = Lineage(claimed)
    except CharterError:
        return []
    return [str(lineage), *(str(a) for a in lineage.ancestors())]


class SpawnService:
    """Spawns on behalf of callers, against one journal (see the module docstring).

    One per process: the composition root (:class:`charter.app.Charter`) builds it with
    the process's shared :class:`Views`, which it keeps current incrementally; every
    face (CLI, Python API, a worker's door) spawns through that one instance.
    """

    def __init__(
        self,
        journal: Journal,
        *,
        keystore: KeyStore,
        policy: GatePolicy | None = None,
        ceilings: FabricCeilings | None = None,
        cell: str = DEFAULT_CELL,
        clock: Clock = now_ms,
        read_registry: RegistryRead | None = None,
        host_load: HostLoad | None = None,
        views: Views | None = None,
        trifecta: Callable[[], TrifectaPolicy] | None = None,
    ) -> None:
        """``trifecta``: gives the operator's policy every mint is checked against for
        the lethal trifecta (docs/scan.md), asked at each fan-out (so a process that
        never spawns, an auditor's, never reads it); :class:`charter.app.Charter` passes
        its home's (:func:`charter.control.trifecta.home_trifecta`, read once). None:
        not checked (a bare service, as unit tests of other stages build)."""
        self.journal = journal
        self.trifecta = trifecta
        self.keystore = keystore
        self.policy: GatePolicy = policy or CostBenefitPolicy()
        self.ceilings = ceilings or FabricCeilings()
        self.cell = cell
        self.clock = clock
        self.read_registry: RegistryRead = read_registry or self._registry_from_leases
        self.host_load: HostLoad = host_load or host_cap_inputs
        self.views = views or Views()
        self.view = self.views.authority
        self.resources = self.views.resources
        self.liveness = self.views.liveness  # which cells run: where children may be placed
        self._delegation: DelegationView | None = None  # watched at its first use

    # -- the directory, as a caller sees it ------------------------------------------

    def agents(self) -> list[AgentRecord]:
        with self.views.lock:
            self.views.refresh(self.journal)
            return self.view.listing()

    def agent(self, name: str) -> AgentRecord:
        with self.views.lock:
            self.views.refresh(self.journal)
            return self.view.agent(name)

    def durable_caller(self, name: str) -> Caller:
        """A durable agent as caller: its ceiling grant and its custody key from the home.

        The key is checked against the directory's trust root before anything else;
        a mismatch is a journaled refusal.
        """
        record = self.agent(name)
        key = self.keystore.load(custody_key_name(name))
        try:
            check_custody(bytes(key.verify_key), record.trust_root, who=str(record.lineage))
        except AuthorityRefusedError as error:
            self._journal_refusal(str(record.lineage), None, error, uuid.uuid4().hex)
            raise
        if record.ceiling is None:
            raise InternalError(f"agent {name!r} was registered without its ceiling grant")
        return Caller((record.ceiling,), key)

    # -- the pipeline ----------------------------------------------------------------

    def spawn(
        self,
        caller: Caller,
        intent: SpawnIntent,
        workers: tuple[WorkerSpec, ...] | None = None,
        *,
        request_id: str | None = None,
        policy: GatePolicy | None = None,
    ) -> SpawnResult:
        """One fan-out through every stage, appended once; raises the named refusal
        (journaled) when refused, and AppendFailedError (nothing handed out) when the
        journal does not commit. With ``workers`` (one per child, or one for all), each
        child is scheduled on the cell in the same append (:class:`WorkerScheduled`).

        ``request_id`` (1-64 letters or digits) makes a retry safe: it is the fan-out id
        and the append's batch id, so a retry after OutcomeUnknownError whose first try
        did commit raises BatchCommittedError instead of minting a second fan-out.
        ``policy`` asks another gate for this fan-out than the service's own."""
        if workers is not None and len(workers) not in (1, intent.width):
            raise BadInputError(
                f"a fan-out of {intent.width} names {len(workers)} workers; give one for "
                "every child, or one for all of them"
            )
        fanout_id = request_id or uuid.uuid4().hex
        gate = _AskedOnce(policy or self.policy)  # a retry carries the first verdict
        # The parent and every ancestor up to the root: a release or a fan-out anywhere
        # above changes what the parent may spend, so the append is pinned to them all.
        chain = _chain_streams(caller.claimed)
        with self.views.lock:  # the views are shared: one decision at a time
            return self._spawn(caller, intent, workers, request_id, fanout_id, gate, chain)

    # -- delegation (docs/delegation.md) ---------------------------------------------

    @property
    def delegation(self) -> DelegationView:
        """Own-sandbox agents and delegations, folded with the other views (watched at
        first use: a process that never delegates never reads them)."""
        with self.views.lock:
            if self._delegation is None:
                self._delegation = DelegationView()
                self.views.watch(self._delegation)
            return self._delegation

    def delegate(
        self,
        caller: Caller,
        agent: str,
        inputs: tuple[str, ...] = (),
        *,
        request_id: str | None = None,
    ) -> SpawnResult:
        """Delegate from ``caller`` (a worker) to own-sandbox agent ``agent``: one child
        of the agent, minted through every stage of the pipeline under the agent's own
        custody key and ceiling (its declared profile), with no depth or fan-out left;
        its lease carved out of the caller's remainder; scheduled to run the agent's
        declared program with ``inputs`` appended. Refused, journaled as
        ``DelegationRefused`` and with nothing minted, reserved or started, when the
        agent has no own sandbox, the caller is itself a delegate, or the caller's
        remainder cannot cover the agent's declared budget."""
        fanout_id = request_id or uuid.uuid4().hex
        view = self.delegation
        with self.views.lock:
            self.views.refresh(self.journal)
            profile = view.profiles.get(agent)
            nested = view.is_delegate(caller.claimed)
        if nested:
            self._refuse_delegation(
                caller.claimed, agent,
                NestedDelegationError(f"{caller.claimed} is a delegate: it cannot delegate"),
            )  # fmt: skip
        if profile is None:
            self._refuse_delegation(
                caller.claimed, agent,
                NotOwnSandboxError(
                    f"{agent!r} is not an own-sandbox agent; register one with "
                    "`charter agent add NAME --own-sandbox --delegate-budget VECTOR -- CMD ARGS...`"
                ),
            )  # fmt: skip
        intent = SpawnIntent(
            width=1,
            objective=(
                f"delegation from {caller.claimed} to own-sandbox agent {agent}, under its "
                "declared profile"
            )[:1000],
            grant=RequestedGrant(depth=0, fanout=0),  # a delegate delegates nothing
            estimated_cost=profile.budget,
        )
        try:
            # On the caller's own cell (placement never moves it): the cell that serves
            # the caller's wait is the one that kills the delegate when the wait stops.
            spec = WorkerSpec(
                argv=profile.argv, inputs=inputs, task_class=f"delegate:{agent}", cell=self.cell
            )
        except ValidationError as e:
            raise BadInputError(f"a delegation's inputs: {describe_invalid(e)}") from e
        workers = (spec,)
        payer = _Payer(caller, agent)
        agent_caller = self.durable_caller(agent)
        chain = [*_chain_streams(agent_caller.claimed), *_chain_streams(caller.claimed)]
        gate = _AskedOnce(self.policy)
        with self.views.lock:
            return self._spawn(
                agent_caller, intent, workers, request_id, fanout_id, gate, chain, payer
            )

    def _refuse_delegation(self, caller: str, agent: str, error: RefusedError) -> NoReturn:
        self.journal.record_refusal(_delegation_refused(caller, agent, error), error)
        raise error

    def _spawn(
        self,
        caller: Caller,
        intent: SpawnIntent,
        workers: tuple[WorkerSpec, ...] | None,
        request_id: str | None,
        fanout_id: str,
        gate: _AskedOnce,
        chain: list[str],
        payer: _Payer | None = None,
    ) -> SpawnResult:
        claimed = caller.claimed
        decisions: list[FanoutDecision] = []
        # Under a population ceiling the count is read at a version of the fabric-wide
        # stream, and the growth appended pinned to it (stage 6): one serialization
        # point for the whole fabric, paid only when a ceiling is configured.
        population = [] if self.ceilings.population is None else [POPULATION_STREAM]
        settling = Settling()  # across the tries: a head pin first, then a settle commit

        def streams() -> list[str]:
            """What each try reads: the chain, every cell a child may be placed on as
            the views stand (their pins read together), the population stream."""
            return [*chain, *self._cell_streams(workers), *population]

        def attempt(versions: dict[str, int]) -> Pinned:
            if not versions.keys() >= set(self._cell_streams(workers)):
                # The views just refreshed know a cell the try did not read (a process's
                # first fan-out, or a cell configured since): tried again with it read,
                # so every fan-out may place on every configured cell.
                raise StreamsGrewError
            if request_id is not None:  # every try: an earlier one may have landed since
                self.journal.require_new_batch(fanout_id)
            now = self.clock()
            pins = {s: versions[s] for s in chain}
            paying = None if payer is None else self._paying(payer, intent, fanout_id, now)
            state = self._resolve(caller, intent, fanout_id, pins.get(claimed, 0), now)
            decision = self._stages(
                state, FanoutCommand(fanout_id, intent, now), gate, settling, workers,
                versions, payer, paying,
            )  # fmt: skip
            decisions.append(decision)
            if decision.refusal is not None:  # journaled as decided, then raised
                return Pinned(decision.events, decision.expect, batch=fanout_id)
            decision = decision.joined((), pins)
            decisions[-1] = decision
            deadline = self._deadline(state)
            if paying is not None:
                deadline = min(deadline, self._deadline(paying))
            return Pinned(
                decision.events,
                decision.expect,
                deadline,
                fanout_id,
                expect_head=settling.expect_head,
                not_before_ms=settling.not_before_ms,
            )

        try:
            # A stream this decision read moved (or, when it took recent expiries as
            # final, anything committed since its read: the head pin), or the parent's
            # lease (or an ancestor's) ended before the commit: it is decided again on
            # the state now.
            done = append_pinned(
                self.journal,
                self.views,
                streams,
                attempt,
                what=f"a fan-out of {claimed}",
                retry_on=(AppendConflictError, DeadlinePassedError),
            )
        except AppendConflictError as error:
            # The gate was asked once for this fan-out: its verdict is journaled even so.
            last = decisions[-1].events if decisions else ()
            asked = [e for e in last if isinstance(e, GateDecided)]
            if asked:
                self.journal.record_refusal(asked[0], error)
            raise
        except AppendFailedError as e:
            refusal = decisions[-1].refusal if decisions else None
            if refusal is not None:
                refusal.add_note(f"(the refusal could not be journaled: {e})")
                raise refusal from e
            raise
        if done is None:  # a fan-out decision always has events to append
            raise InternalError("a fan-out decided nothing to append")
        decision, committed = decisions[-1], done[1]
        if decision.refusal is not None:
            raise decision.refusal
        if decision.gate is None:  # decide always asks the gate before minting
            raise InternalError("a fan-out was minted without a gate decision")
        admitted = [e.lineage for e in decision.events if isinstance(e, SlotAdmitted)]
        queued = [x for e in decision.events if isinstance(e, SlotQueued) for x in e.lineages]
        return SpawnResult(
            fanout_id,
            decision.parent,
            decision.gate,
            decision.children,
            (committed[0].position, committed[-1].position),
            admitted=tuple(admitted),
            queued=tuple(queued),
        )

    def _stages(
        self,
        state: ParentState,
        command: FanoutCommand,
        gate: _AskedOnce,
        settling: Settling,
        workers: tuple[WorkerSpec, ...] | None,
        versions: dict[str, int],
        payer: _Payer | None,
        paying: ParentState | None,
    ) -> FanoutDecision:
        """Stages 2 to 6, in order, on the resolved parent (a delegation's record joins
        before its reservation, its refusal after the stage that refused)."""
        decision = decide(  # the gate (once) and the mints
            state,
            command,
            policy=gate,
            trifecta=None if self.trifecta is None else self.trifecta(),
        )
        if payer is not None:  # the delegation, before its reservation
            decision = _delegation_requested(decision, payer)
        decision = self._lease(decision, command.intent, command.now_ms, settling, paying)
        try:
            cells = self._placement(decision, workers, versions, command.now_ms)
        except NoCellOfClassError as error:
            decision, cells = decision.refused(error, str(decision.parent), command.intent), []
        decision = self._schedule(decision, workers, cells, versions)
        decision = self._admit(decision, versions, workers, cells)
        decision = self._ceilings_fail_open(decision, command.intent, versions)
        if payer is not None and decision.refusal is not None:
            refused = _delegation_refused(payer.caller.claimed, payer.agent, decision.refusal)
            decision = decision.joined((refused,))
        return decision

    def _deadline(self, state: ParentState) -> int:
        """The first instant the decision stops being true: the parent's grant expires,
        or its lease or an ancestor's does. The journal refuses to commit at or after it."""
        parent = str(state.lineage)
        grant_end = state.sealed.grant.terms.expires_at_ms
        lease_end = self.resources.book.deadline(parent) if parent in self.resources.book else None
        return grant_end if lease_end is None else min(grant_end, lease_end)

    def _resolve(
        self, caller: Caller, intent: SpawnIntent, fanout_id: str, version: int, now: int
    ) -> ParentState:
        """Stage 1: check what the caller holds; the parent is its journaled leaf grant."""
        try:
            leaf = self._verified_leaf(caller, now)
        except AuthorityRefusedError as error:
            self._journal_refusal(caller.claimed, intent, error, fanout_id)
            raise
        return ParentState(
            sealed=leaf,
            custody_seed=bytes(caller.custody_key),
            minted=self.view.minted.get(leaf.grant.lineage, 0),
            reserved=self.view.reserved.get(leaf.grant.lineage, 0),
            version=version,
        )

    def _verified_leaf(self, caller: Caller, now: int) -> SealedGrant:
        if not caller.chain:
            raise GrantChainBrokenError("a caller must present its chain of grants")
        # Authority is read from the signed bytes, never from a parsed object handed in.
        chain = tuple(SealedGrant(body=s.body, signature=s.signature) for s in caller.chain)
        root = chain[0].grant.lineage
        record = self.view.agents.get(root.root_name)
        if record is None or record.lineage != root:
            raise UnknownParentError(
                f"{root} is not a durable agent in the directory; register it with "
                "`charter agent add`"
            )
        leaf = chain[-1]
        custody = bytes(caller.custody_key.verify_key)
        if len(chain) == 1:
            check_custody(custody, record.trust_root, who=str(root))
        check_custody(custody, bytes.fromhex(leaf.grant.subject_key), who=str(leaf.grant.lineage))
        verify_grant_chain(chain, record.trust_root, now_ms=now)
        revoked = self.view.revoked_above(leaf.grant.lineage)
        if revoked is not None:
            raise LineageRevokedError(
                f"{revoked} was revoked (position {self.view.revoked[revoked]}): nothing "
                f"below it may spawn"
            )
        journaled = self.view.digests.get(leaf.grant.lineage, b"")
        if not hmac.compare_digest(journaled, leaf.digest):
            raise GrantNotJournaledError(
                f"the grant presented for {leaf.grant.lineage} is not the one the journal "
                "committed; only journaled grants carry authority"
            )
        return leaf

    def _paying(self, payer: _Payer, intent: SpawnIntent, fanout_id: str, now: int) -> ParentState:
        """A delegation's payer, checked as a parent is (its chain verified from the
        signed bytes, journaled, not revoked); a refusal is journaled as the delegation's."""
        try:
            leaf = self._verified_leaf(payer.caller, now)
        except AuthorityRefusedError as error:
            self._journal_refusal(payer.caller.claimed, intent, error, fanout_id)
            self.journal.record_refusal(
                _delegation_refused(payer.caller.claimed, payer.agent, error), error
            )
            raise
        return ParentState(
            sealed=leaf, custody_seed=b"", minted=0, reserved=0, version=0
        )  # its key is never used: the payer mints nothing

    def _lease(
        self,
        decision: FanoutDecision,
        intent: SpawnIntent,
        now: int,
        settling: Settling,
        paying: ParentState | None = None,
    ) -> FanoutDecision:
        """Stage 4: lease each child exactly what its grant says (the mint made the
        grant the child's share of the estimate, for that share's wall-clock time), out
        of the parent's remainder (a delegation's: out of ``paying``'s, the calling
        worker's). Refuses the whole fan-out when the leases do not fit, would outlive
        the parent's, or the parent has no ledger."""
        if decision.refusal is not None:
            return decision
        parent = str(decision.parent if paying is None else paying.lineage)
        children = [
            (
                str(child.lineage),
                child.grant.terms.budget,
                child.grant.terms.expires_at_ms,
                child.sealed.digest.hex(),
            )
            for child in decision.children
        ]
        try:
            # Children whose expiry the views cannot know to be final yet count as live
            # (a usage stamped before their end may still commit: LeaseBook.remaining),
            # unless the fan-out needs them: then its append pins the journal's head.
            leases = settling.decide(
                self.journal,
                self.views,
                parent,
                now,
                lambda settled_ms: self.resources.book.decide_leases(
                    parent, children, now, decision.fanout_id, settled_ms
                ),
            )
        except RefusedError as error:
            return decision.refused(error, parent, intent)
        # Leases go on the parent's stream, which the mints (a delegation: its payer's
        # chain) already pinned.
        return decision.joined(leases)

    def _cell_streams(self, workers: tuple[WorkerSpec, ...] | None) -> list[str]:
        """The streams of the cells a fan-out may place on, as the views stand: each
        cell's, and for class children its run stream too (their placement reads the
        cell's classes)."""
        placeable = self._placeable(workers)
        streams = [f"cell:{c}" for c in placeable]
        if any(w.cell_class is not None for w in workers or ()):
            streams += [cellrun_stream(c) for c in placeable]
        return streams

    def _placeable(self, workers: tuple[WorkerSpec, ...] | None) -> list[str]:
        """The cells a fan-out may place children on: this service's own, every
        configured one, and every one a worker names (sorted: one order of reads)."""
        named = {w.cell for w in workers or () if w.cell is not None}
        return sorted({self.cell, *self.resources.cells.cells(), *named})

    def _placement(
        self,
        decision: FanoutDecision,
        workers: tuple[WorkerSpec, ...] | None,
        versions: dict[str, int],
        now: int,
    ) -> list[str]:
        """Stage 4a's placement: the cell of each child, by the rule of
        :mod:`charter.control.placement` over the live cells whose stream this decision
        read (their caps now, their holders and queues)."""
        if decision.refusal is not None or workers is None:
            return []
        specs = workers * len(decision.children) if len(workers) == 1 else workers
        asks = [Ask(s.cell, s.cell_class) for s in specs]
        return place(asks, self._rooms(versions, now), self.cell)

    def cap_inputs(self, cell: str, now: int) -> CapInputs | None:
        """The adaptive cap's inputs for ``cell``: this host's load, and the other live
        cells on that cell's host (its ``live_peers``: they share its cores). None for a
        cell with no caps."""
        state = self.resources.cells.cells().get(cell)
        if state is None or not state.caps:
            return None
        inputs = self.host_load(state.cores, state.failover_reserve)
        peers = self.liveness.peers_on_host(cell, now)
        return inputs.model_copy(update={"live_peers": inputs.live_peers + peers})

    def _schedule(
        self,
        decision: FanoutDecision,
        workers: tuple[WorkerSpec, ...] | None,
        cells: list[str],
        versions: dict[str, int],
    ) -> FanoutDecision:
        """Stage 4a: what each child runs, scheduled on the cell before its slot, so a
        cell that sees the slot has already seen the schedule (same append). A child
        placed by class pins its cell's run stream: a restart with other classes
        before the commit decides the fan-out again."""
        if decision.refusal is not None or workers is None:
            return decision
        specs = workers * len(decision.children) if len(workers) == 1 else workers
        scheduled = tuple(
            WorkerScheduled(
                fanout=decision.fanout_id,
                lineage=str(child.lineage),
                cell=cell,
                argv=spec.argv,
                inputs=spec.inputs,
                inputs_digest=spec.digest(),
                grant_digest=child.sealed.digest.hex(),
                task_class=spec.task_class or task_class_of(spec.argv),
                dry_run=spec.dry_run,
                requested=spec.cell is not None,
                cell_class=spec.cell_class,
            )
            for child, spec, cell in zip(decision.children, specs, cells, strict=True)
        )
        runs = {cellrun_stream(s.cell) for s in scheduled if s.cell_class is not None}
        return decision.joined(scheduled, {r: versions[r] for r in runs})

    def _admit(
        self,
        decision: FanoutDecision,
        versions: dict[str, int],
        workers: tuple[WorkerSpec, ...] | None,
        cells: list[str],
    ) -> FanoutDecision:
        """Stage 5: on each child's cell, a processing slot while there is room, the
        rest queued in order. Pinned to the stream of every cell it admits on, so two
        fan-outs never take the same last slot. Children with nothing to run (no
        workers) take no slot: a slot is room to run, and one held by a child that
        never runs would keep a scheduled worker queued behind it for as long as its
        lease lives."""
        if decision.refusal is not None or workers is None:
            return decision
        now = self.clock()
        by_cell: dict[str, list[str]] = {}
        for child, cell in zip(decision.children, cells, strict=True):
            by_cell.setdefault(cell, []).append(str(child.lineage))
        for cell, lineages in by_cell.items():
            placed = self.resources.cells.decide_place(
                cell, lineages, ResourceClass.PROCESSING, self.cap_inputs(cell, now)
            )
            if not any(isinstance(e, SlotAdmitted) for e in placed):
                # Only queued: a queue never oversubscribes, so the cell's stream is not
                # pinned and concurrent fan-outs do not race for it (the journal orders
                # their SlotQueued events on that stream itself).
                decision = decision.joined(placed)
                continue
            stream = f"cell:{cell}"
            if stream not in versions:  # a cell configured after the pins were read
                raise InternalError(f"cell {cell} was placed on without its stream's pin")
            decision = decision.joined(placed, {stream: versions[stream]})
        return decision

    def move_off(
        self,
        gone: str,
        moving: Callable[[], list[tuple[WorkerScheduled, int]]],
        fence: dict[str, int],
    ) -> int:
        """Move the workers of cell ``gone`` that have not started to live cells, by the
        placement rule: in one append, each one's slot on ``gone`` given back (or its
        place in the queue), its schedule again naming its new cell, and its slot there
        (or its place in that queue). ``moving()`` gives, on the views as they stand,
        each worker to move with its stream's version (its stream holds only its
        schedules); the append is pinned to those versions (a worker killed or started
        meanwhile is decided again), to the cells' streams and to ``fence`` (the
        reaper's claim on ``gone``). Returns how many moved (0: no live cell to take
        them, or none to move)."""
        with self.views.lock:
            self.views.refresh(self.journal)
        candidates = self._placeable(None)
        streams = [f"cell:{c}" for c in candidates] + [cellrun_stream(c) for c in candidates]
        moved = 0

        def decide(versions: dict[str, int]) -> Pinned | None:
            nonlocal moved
            now = self.clock()
            rooms = [room for room in self._rooms(versions, now) if room.cell != gone]
            # A worker asking a class moves only to a live cell of it: with none, it
            # waits on the gone cell's queue (docs/fabric.md).
            classes = {k for room in rooms for k in room.classes}
            workers = [
                (w, v) for w, v in moving() if w.cell_class is None or w.cell_class in classes
            ]
            if not workers or not rooms:
                return None  # nowhere to go: they wait on the gone cell's queue
            targets = place([Ask(cell_class=w.cell_class) for w, _ in workers], rooms, gone)
            state = self.resources.cells.cells().get(gone) or CellState(gone, {}, 0, 0)
            events: list[Event] = []
            pins = {f"cell:{gone}": versions[f"cell:{gone}"], **fence}
            by_cell: dict[str, list[str]] = {}
            for (scheduled, version), cell in zip(workers, targets, strict=True):
                lineage = scheduled.lineage
                pins[worker_stream(lineage)] = version
                if (
                    lineage in state.holders[ResourceClass.PROCESSING]
                    or lineage in (state.queued[ResourceClass.PROCESSING])
                ):
                    events.append(
                        self.resources.cells.decide_leave(gone, lineage, ResourceClass.PROCESSING)
                    )
                events.append(scheduled.model_copy(update={"cell": cell}))
                by_cell.setdefault(cell, []).append(lineage)
                if scheduled.cell_class is not None:  # placed by its cell's classes
                    pins[cellrun_stream(cell)] = versions[cellrun_stream(cell)]
            for cell, lineages in by_cell.items():
                placed = self.resources.cells.decide_place(
                    cell, lineages, ResourceClass.PROCESSING, self.cap_inputs(cell, now)
                )
                events.extend(placed)
                if any(isinstance(e, SlotAdmitted) for e in placed):
                    pins[f"cell:{cell}"] = versions[f"cell:{cell}"]
            moved = len(workers)
            return Pinned(events, pins)

        done = append_pinned(
            self.journal, self.views, streams, decide, what=f"the move off cell {gone}"
        )
        return 0 if done is None else moved

    def _rooms(self, versions: dict[str, int], now: int) -> list[CellRoom]:
        """The live cells a child may be placed on (their stream read): free processing
        slots under their cap now, less those held and queued for."""
        rooms = []
        for cell in self.liveness.live_cells(now):
            state = self.resources.cells.cells().get(cell)
            if f"cell:{cell}" not in versions or state is None or not state.caps:
                continue
            cap, _ = self.resources.cells.cap(
                cell, ResourceClass.PROCESSING, self.cap_inputs(cell, now)
            )
            queued = len(state.queued[ResourceClass.PROCESSING])
            free = cap - state.occupancy(ResourceClass.PROCESSING) - queued
            classes = frozenset(self.liveness.classes.get(cell, ()))
            rooms.append(CellRoom(cell, max(0, free), queued, classes))
        return rooms

    def _ceilings_fail_open(
        self, decision: FanoutDecision, intent: SpawnIntent, versions: dict[str, int]
    ) -> FanoutDecision:
        """Stage 6: the fabric ceilings. FAILS OPEN, on purpose (DESIGN §5): the registry
        may lag or be unreachable, and a fabric that stops spawning whenever it is would
        turn a read-side fault into an outage. When the read fails, the fan-out proceeds
        and ``CeilingCheckFailedOpen`` joins its append. Budgets and admission, which
        protect the host and the money, stay fail-closed.

        Under a population ceiling (its stream read with the others), the growth joins
        the append as ``PopulationGrew``, pinned to the stream's version: a fan-out
        under any other root that read the same count conflicts, and is decided again on
        the views refreshed (the count now, every end folded in)."""
        if decision.refusal is not None:
            return decision
        try:
            facts = self.read_registry()
        except Exception as error:  # noqa: BLE001 - any registry fault fails open, journaled
            event = CeilingCheckFailedOpen(
                fanout=decision.fanout_id, error=f"{type(error).__name__}: {error}"
            )
            return decision.joined((event,))
        refusal = check_ceilings(facts, decision.parent, intent.width)
        if refusal is not None:
            return decision.refused(refusal, str(decision.parent), intent)
        if facts.population_ceiling is None or POPULATION_STREAM not in versions:
            return decision
        grew = PopulationGrew(
            fanout=decision.fanout_id,
            live=facts.live_population + intent.width,
            width=intent.width,
            ceiling=facts.population_ceiling,
        )
        return decision.joined((grew,), {POPULATION_STREAM: versions[POPULATION_STREAM]})

    def _registry_from_leases(self) -> RegistryFacts:
        """The registry as this service's own fold sees it: live workers are the leases
        active now (the fold is refreshed at the start of each attempt)."""
        now = self.clock()
        live = self.resources.population.live(now)
        return RegistryFacts(
            population_ceiling=self.ceilings.population,
            depth_ceiling=self.ceilings.depth,
            live_population=live,
        )

    def _journal_refusal(
        self, actor: str, intent: SpawnIntent | None, error: RefusedError, fanout_id: str
    ) -> None:
        event = refusal_event(
            fanout_id,
            actor,
            error,
            width=intent.width if intent else 0,
            objective=intent.objective if intent else "",
        )
        self.journal.record_refusal(event, error)
