"""Budgets and slots joined to fan-outs: leases in the same append as the mints.

:class:`ResourceView` folds the lease book and the cells from the journal incrementally
(as :class:`~charter.ledger.authority.AuthorityView` does for the directory), timing
each entry by its commit time. :class:`LeaseStage` is the fan-out stage that carves
each minted child's lease out of its parent's remaining budget, or refuses the whole
fan-out (journaled) when it does not fit or the parent has no ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from charter.ledger._follow import JournalFold, entry_ms, now_ms
from charter.ledger.admission import (
    ADMISSION_EVENTS,
    AdmissionRefusedError,
    CapInputs,
    CellConfigured,
    Cells,
    ResourceClass,
    SlotAdmitted,
)
from charter.ledger.authority import Extension, FanoutDecision, SpawnIntent
from charter.ledger.budget import Budget
from charter.ledger.errors import RefusedError
from charter.ledger.events import Event
from charter.ledger.journal import AppendConflictError, Committed, Journal
from charter.ledger.leases import (
    LEASE_EVENTS,
    BudgetRefused,
    LeaseBook,
    LeaseReleased,
    LeaseRenewed,
    UsageRecorded,
)

__all__ = [
    "AdmissionService",
    "LeaseStage",
    "CeilingCheckFailedOpen",
    "DepthCeilingError",
    "PopulationCeilingError",
    "RegistryFacts",
    "fabric_ceilings_fail_open",
    "BudgetService",
    "ResourceView",
    "default_stages",
    "entry_ms",
]

_RETRIES = 5
E = TypeVar("E", bound=Event)


_TYPES = tuple(cls.type_name for cls in (*LEASE_EVENTS, *ADMISSION_EVENTS))


class ResourceView(JournalFold):
    """The lease book and the cells, kept current from the journal."""

    types = _TYPES

    def __init__(self) -> None:
        super().__init__()
        self.book = LeaseBook()
        self.cells = Cells()

    def apply(self, event: Event, position: int, at_ms: int) -> None:
        del position
        if isinstance(event, LEASE_EVENTS):
            self.book.apply(event, at_ms)
        elif isinstance(event, ADMISSION_EVENTS):
            self.cells.apply(event)


class LeaseStage:
    """The fan-out stage that leases each child a share of the fan-out's cost.

    Each child is leased ``estimated cost / width`` (capped by its grant's budget), for
    its wall-clock allocation, and never past its grant's expiry (nor, in
    :meth:`LeaseBook.decide_leases`, past its parent's lease). Leases go on the parent's
    stream, which the authority stage already pinned.
    """

    def __init__(self, journal: Journal, view: ResourceView, clock: Callable[[], int]) -> None:
        self.journal = journal
        self.view = view
        self.clock = clock

    def __call__(self, decision: FanoutDecision, intent: SpawnIntent) -> FanoutDecision:
        self.view.refresh(self.journal)
        now = self.clock()
        share = intent.estimated_cost.split(intent.width)
        children = []
        lease_of: dict[int, tuple[Budget, int]] = {}  # the children of a fan-out share terms
        for child in decision.children:
            terms = child.grant.terms
            lease = lease_of.get(id(terms))
            if lease is None:
                allocation = share.minimum(terms.budget)
                expires = min(terms.expires_at_ms, now + allocation.wall_ms)
                lease = lease_of[id(terms)] = (allocation, expires)
            children.append((str(child.lineage), *lease))
        try:
            leases = self.view.book.decide_leases(str(decision.parent), children, now)
        except RefusedError as error:
            return decision.refused(error, str(decision.parent), intent)
        return decision.joined(leases)

    def on_commit(self, committed: tuple[Committed, ...]) -> None:
        """Fold the fan-out's own commit without reading it back."""
        self.view.applied(committed)


def default_stages(journal: Journal, clock: Callable[[], int]) -> list[Extension]:
    """The stages every fan-out goes through after the authority's own: leases."""
    return [LeaseStage(journal, ResourceView(), clock)]


class BudgetService:
    """Usage, release and renewal of leases: decide on the folded state, append pinned
    to the stream the decision read, refuse (journaled) what the book does not allow."""

    def __init__(self, journal: Journal, clock: Callable[[], int] = now_ms) -> None:
        self.journal = journal
        self.clock = clock
        self.view = ResourceView()

    def remaining(self, lineage: str, at_ms: int | None = None) -> Budget:
        """What ``lineage`` holds now (or at ``at_ms``), from the journal as it stands."""
        self.view.refresh(self.journal)
        return self.view.book.remaining(lineage, self.clock() if at_ms is None else at_ms)

    def record_usage(self, lineage: str, amount: Budget) -> UsageRecorded:
        return self._decide_and_append(
            "usage", lineage, lambda now: self.view.book.decide_usage(lineage, amount, now)
        )

    def release(self, lineage: str) -> LeaseReleased:
        return self._decide_and_append(
            "release", lineage, lambda now: self.view.book.decide_release(lineage, now)
        )

    def renew(self, lineage: str, expires_at_ms: int) -> LeaseRenewed:
        return self._decide_and_append(
            "renew",
            lineage,
            lambda now: self.view.book.decide_renewal(lineage, expires_at_ms, now),
        )

    def _decide_and_append(self, operation: str, lineage: str, decide: Callable[[int], E]) -> E:
        for _ in range(_RETRIES):
            # Versions first, then the view: the view covers everything they do.
            expect = {s: self.journal.stream_version(s) for s in self._streams(operation, lineage)}
            self.view.refresh(self.journal)
            now = self.clock()
            try:
                event = decide(now)
            except RefusedError as error:
                refusal = BudgetRefused(
                    lineage=lineage,
                    operation=operation,
                    reason=error.reason,
                    message=str(error),
                )
                self.journal.record_refusal(refusal, error)
                raise
            try:
                committed = self.journal.append([event], expect=expect)
            except AppendConflictError:
                continue
            self.view.applied(committed)
            return event
        raise AppendConflictError(f"{operation} of {lineage} kept racing other writers; retry")

    def _streams(self, operation: str, lineage: str) -> list[str]:
        """The streams the decision depends on. A renewal: the parent's, which holds
        the budget (renewals go on it). Usage: the lease's own and every ancestor's,
        since releasing an ancestor lease ends this lease too and its budget goes back
        up (a usage decided before that release must not commit after it). A release:
        the lease's own."""
        if lineage not in self.view.book:
            self.view.refresh(self.journal)
        if lineage not in self.view.book:
            return [lineage]  # the decision refuses it, with its named reason
        ledger = self.view.book.get(lineage)
        if operation == "renew":
            return [ledger.parent or lineage]
        streams = [lineage]
        while operation == "usage" and ledger.parent is not None:
            ledger = self.view.book.get(ledger.parent)
            if ledger.parent is not None:  # a lease (a root's ledger is never released)
                streams.append(ledger.lineage)
        return streams


class AdmissionService:
    """Slots on cells: admit (all or none), release, and the coordinator's swap, each
    appended pinned to the cell's stream so no two admitters can take the last slot."""

    def __init__(self, journal: Journal, view: ResourceView | None = None) -> None:
        self.journal = journal
        self.view = view or ResourceView()

    def configure(
        self, cell: str, caps: dict[ResourceClass, int], *, cores: int, failover_reserve: int
    ) -> CellConfigured:
        (event,) = self._pinned(
            cell,
            lambda: (
                self.view.cells.decide_configure(
                    cell, caps, cores=cores, failover_reserve=failover_reserve
                ),
            ),
        )
        if not isinstance(event, CellConfigured):  # decide_configure makes only that
            raise TypeError(event)
        return event

    def admit(
        self,
        cell: str,
        lineages: list[str],
        resource: ResourceClass,
        inputs: CapInputs | None = None,
    ) -> tuple[SlotAdmitted, ...]:
        """Admit all of ``lineages`` or raise :class:`AdmissionRefusedError` (journaled,
        with its retry-after)."""

        def decide() -> tuple[Event, ...]:
            try:
                return self.view.cells.decide_admit(cell, lineages, resource, inputs)
            except AdmissionRefusedError as error:
                refusal = self.view.cells.refusal(cell, lineages[0], resource, error, inputs)
                self.journal.record_refusal(refusal, error)
                raise

        return tuple(e for e in self._pinned(cell, decide) if isinstance(e, SlotAdmitted))

    def release(self, cell: str, lineage: str, resource: ResourceClass) -> None:
        self._pinned(cell, lambda: (self.view.cells.decide_release(cell, lineage, resource),))

    def wait_on_children(self, cell: str, lineage: str) -> None:
        """Give back the processing slot and hold a coordination slot instead."""
        self._pinned(cell, lambda: self.view.cells.decide_wait_on_children(cell, lineage))

    def _pinned(self, cell: str, decide: Callable[[], tuple[Event, ...]]) -> tuple[Event, ...]:
        stream = f"cell:{cell}"
        for _ in range(_RETRIES * 4):
            version = self.journal.stream_version(stream)
            self.view.refresh(self.journal)
            events = decide()
            try:
                committed = self.journal.append(events, expect={stream: version})
            except AppendConflictError:
                continue
            self.view.applied(committed)
            return events
        raise AppendConflictError(f"admission on cell {cell!r} kept racing; retry")


class CeilingCheckFailedOpen(Event):
    """The fabric ceilings could not be read; the fan-out went ahead without them.

    Journaled in the same append as the fan-out, so auditors see every time it happened.
    """

    type_name = "CeilingCheckFailedOpen"
    fanout: str
    error: str


class PopulationCeilingError(RefusedError):
    """The fabric already runs as many workers as its population ceiling allows."""

    reason = "population-ceiling"


class DepthCeilingError(RefusedError):
    """The fan-out would place workers deeper than the fabric's depth ceiling."""

    reason = "depth-ceiling"


@dataclass(frozen=True)
class RegistryFacts:
    """What the registry (a projection) says: the ceilings and the live population."""

    population_ceiling: int
    depth_ceiling: int
    live_population: int


def fabric_ceilings_fail_open(read_registry: Callable[[], RegistryFacts]) -> Extension:
    """Fabric-wide population and depth ceilings, from the registry.

    FAILS OPEN, on purpose (DESIGN.md §5): the registry is a projection that may lag or
    be unreachable, and a fabric that stops spawning whenever it is would turn a
    read-side fault into an outage. When the read fails, the fan-out proceeds and a
    ``CeilingCheckFailedOpen`` event joins its append. Budgets and admission, which
    protect the host and the money, stay fail-closed.
    """

    def extend(decision: FanoutDecision, intent: SpawnIntent) -> FanoutDecision:
        try:
            facts = read_registry()
        except Exception as error:  # noqa: BLE001 - any registry fault fails open, journaled
            event = CeilingCheckFailedOpen(
                fanout=decision.fanout_id, error=f"{type(error).__name__}: {error}"
            )
            return decision.joined((event,))
        depth = len(decision.parent.segments)  # a child is one segment deeper
        if depth > facts.depth_ceiling:
            return decision.refused(
                DepthCeilingError(
                    f"workers at depth {depth} would exceed the fabric's depth ceiling of "
                    f"{facts.depth_ceiling}"
                ),
                str(decision.parent),
                intent,
            )
        if facts.live_population + intent.width > facts.population_ceiling:
            return decision.refused(
                PopulationCeilingError(
                    f"{facts.live_population} workers are live and {intent.width} more would "
                    f"exceed the fabric's population ceiling of {facts.population_ceiling}; "
                    "retry when some have finished"
                ),
                str(decision.parent),
                intent,
            )
        return decision

    return extend
