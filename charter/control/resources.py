"""Budgets and slots as command handlers: decide on the folded state, append pinned to
the streams the decision read, refuse (journaled) what the rules do not allow.

:class:`ResourceView` folds the lease book and the cells from the journal incrementally,
timing each entry by its commit time. A fan-out's leases and admissions are stages of
the spawn pipeline (:mod:`charter.control.spawn`), in the fan-out's one append.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, TypeVar

from charter.budgets import (
    ADMISSION_EVENTS,
    LEASE_EVENTS,
    AdmissionRefusedError,
    BudgetRefused,
    CapInputs,
    CellConfigured,
    Cells,
    LeaseBook,
    LeaseEndedError,
    LeaseReleased,
    LeaseRenewed,
    ResourceClass,
    SlotAdmitted,
    UnknownLeaseError,
    UsageRecorded,
)
from charter.core import Budget, Event, RefusedError, now_ms
from charter.core.errors import InternalError
from charter.ledger import AppendConflictError, DeadlinePassedError, Journal, JournalFold

__all__ = ["AdmissionService", "BudgetService", "ResourceView"]

_RETRIES = 5
E = TypeVar("E", bound=Event)
# A caller's events for the same append as a decision, and the stream versions they
# were decided on (read after the decision's own).
Also = Callable[[], tuple[Sequence[Event], Mapping[str, int]]]

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

    def release(self, lineage: str, then: Also | None = None) -> LeaseReleased:
        """Return ``lineage``'s lease. ``then`` adds the caller's own events to the same
        append, decided on its own pinned streams after the lease's were read (the cell
        returns a worker's lease and ends it in one commit); on a conflict with either,
        both are decided again."""
        return self._decide_and_append(
            "release", lineage, lambda now: self.view.book.decide_release(lineage, now), then
        )

    def renew(self, lineage: str, expires_at_ms: int) -> LeaseRenewed:
        return self._decide_and_append(
            "renew",
            lineage,
            lambda now: self.view.book.decide_renewal(lineage, expires_at_ms, now),
        )

    def _decide_and_append(
        self,
        operation: str,
        lineage: str,
        decide: Callable[[int], E],
        then: Also | None = None,
    ) -> E:
        self.view.refresh(self.journal)
        if lineage not in self.view.book:  # a typo is not a policy decision: not journaled
            raise UnknownLeaseError(
                f"no lease or budget ledger for {lineage} in the journal; nothing was "
                "journaled (`charter budgets` lists the lineages that have one)"
            )
        for _ in range(_RETRIES):
            # Versions first, then the view: the view covers everything they do.
            expect = {s: self.journal.stream_version(s) for s in self._streams(operation, lineage)}
            self.view.refresh(self.journal)
            also, pins = then() if then is not None else ((), {})
            now = self.clock()
            try:
                event = decide(now)
                # Usage and renewal rely on the lease (and every ancestor's) being live:
                # the journal refuses, under its write lock, to commit them at or after
                # the first of those expiries.
                deadline = self.view.book.deadline(lineage) if operation != "release" else None
                committed = self.journal.append(
                    [event, *also], expect={**expect, **pins}, deadline_ms=deadline
                )
            except AppendConflictError:
                continue
            except DeadlinePassedError as e:
                self._refuse(
                    operation,
                    lineage,
                    LeaseEndedError(
                        f"{lineage}'s lease (or an ancestor's) ended before the {operation} "
                        f"could commit; nothing was charged ({e})"
                    ),
                )
            except RefusedError as error:
                self._refuse(operation, lineage, error)
            self.view.applied(committed)
            return event
        raise AppendConflictError(f"{operation} of {lineage} kept racing other writers; retry")

    def _refuse(self, operation: str, lineage: str, error: RefusedError) -> NoReturn:
        """Journal a refusal with its stable reason code, then raise it."""
        refusal = BudgetRefused(
            lineage=lineage, operation=operation, reason=error.reason, message=str(error)
        )
        self.journal.record_refusal(refusal, error)
        raise error

    def _streams(self, operation: str, lineage: str) -> list[str]:
        """The streams the decision depends on. A renewal: the parent's, which holds
        the budget (renewals go on it), and its ancestors'. Usage: the lease's own and
        every ancestor's up to the root, since releasing an ancestor lease ends this
        lease too and a parent's fan-out spends what it has left (a usage decided before
        either must not commit after it). A release: the lease's own."""
        if lineage not in self.view.book:
            self.view.refresh(self.journal)
        if lineage not in self.view.book:
            return [lineage]  # the decision refuses it, with its named reason
        chain = [ledger.lineage for ledger in self.view.book.chain(lineage)]
        if operation == "renew":
            return chain[1:] or chain
        return chain if operation == "usage" else chain[:1]


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
            raise InternalError(f"decide_configure made {type(event).__name__}")
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
