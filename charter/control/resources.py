"""Budgets and slots as command handlers: decide on the folded state, append pinned to
the streams the decision read, refuse (journaled) what the rules do not allow.

:class:`ResourceView` folds the lease book and the cells from the journal incrementally,
timing each entry by its commit time. A fan-out's leases and admissions are stages of
the spawn pipeline (:mod:`charter.control.spawn`), in the fan-out's one append.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, TypeVar

from pydantic import ValidationError

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
    SlotReleaseRacedError,
    UnknownLeaseError,
    UsageRecorded,
)
from charter.core import BadInputError, Budget, Event, RefusedError, describe_invalid, now_ms
from charter.core.errors import InternalError
from charter.core.text import shown
from charter.ledger import AppendConflictError, DeadlinePassedError, Journal, JournalFold

__all__ = ["AdmissionService", "BudgetService", "ResourceView"]

_RETRIES = 5
# How long a slot's release keeps deciding again while it loses races: the journal's
# own write-lock timeout (30 s by default on both backends), so a release gives up no
# sooner than a writer stuck behind the lock would.
_RELEASE_PATIENCE_S = 30.0
E = TypeVar("E", bound=Event)
T = TypeVar("T")
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
        """Move the lease's end to ``expires_at_ms``. An end that is not a whole number
        from 0 to 2^63 − 1 is bad input (nothing journaled); past the parent's lease,
        the grant's expiry or the last instant a date renders, a journaled refusal."""
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
                f"no lease or budget ledger for {shown(lineage)} in the journal; nothing "
                "was journaled (`charter budgets` lists the lineages that have one)"
            )
        for _ in range(_RETRIES):
            # Versions first, then the view: the view covers everything they do.
            expect = {s: self.journal.stream_version(s) for s in self._streams(operation, lineage)}
            self.view.refresh(self.journal)
            also, pins = then() if then is not None else ((), {})
            now = self.clock()
            try:
                try:
                    event = decide(now)
                except ValidationError as invalid:  # a value no event can carry
                    raise BadInputError(
                        f"{operation} of {shown(lineage)}: {describe_invalid(invalid)}; "
                        "nothing was journaled"
                    ) from None
                # Usage, release and renewal all rely on the lease (and every
                # ancestor's) being live: the journal refuses, under its write lock, to
                # commit them at or after the first of those expiries. (A release that
                # commits later would record the end of a lease that had already ended,
                # later than it ended.)
                deadline = self.view.book.deadline(lineage)
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
                        f"{shown(lineage)}'s lease (or an ancestor's) ended before the "
                        f"{operation} could commit; nothing was journaled for it ({e})"
                    ),
                )
            except RefusedError as error:
                self._refuse(operation, lineage, error)
            self.view.applied(committed)
            return event
        raise AppendConflictError(
            f"{operation} of {shown(lineage)} kept racing other writers; nothing was "
            "journaled for it; retry"
        )

    def _refuse(self, operation: str, lineage: str, error: RefusedError) -> NoReturn:
        """Journal a refusal with its stable reason code, then raise it."""
        refusal = BudgetRefused(
            lineage=lineage, operation=operation, reason=error.reason, message=str(error)
        )
        self.journal.record_refusal(refusal, error)
        raise error

    def _streams(self, operation: str, lineage: str) -> list[str]:
        """The streams the decision depends on: the lease's own and every ancestor's up
        to the root, for every operation. Releasing an ancestor's lease ends this one
        too, and this lease's own release ends it: a usage, release or renewal decided
        before either must not commit after it (the lease had ended). A parent's fan-out
        spends what it has left (a usage decided before it must not commit after it),
        and renewals go on the parent's stream, which holds the budget."""
        del operation  # the same chain for each (kept for the callers' clarity)
        if lineage not in self.view.book:
            self.view.refresh(self.journal)
        if lineage not in self.view.book:
            return [lineage]  # the decision refuses it, with its named reason
        return [ledger.lineage for ledger in self.view.book.chain(lineage)]


class AdmissionService:
    """Slots on cells: admit (all or none), release, and the coordinator's swap, each
    appended pinned to the cell's stream so no two admitters can take the last slot.
    Every refusal of a slot (an admission or a swap) is journaled once, with its
    retry-after; a model's complaint about a value reaches the caller as bad input."""

    def __init__(
        self,
        journal: Journal,
        view: ResourceView | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.journal = journal
        self.view = view or ResourceView()
        self.monotonic = monotonic

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
        with its retry-after). Idempotent per holder: a lineage named twice, or one
        that already holds a slot of ``resource``, is not admitted again (the answer
        holds only the new admissions, and is empty when there are none)."""
        return tuple(
            e
            for e in self._pinned(
                cell, lambda: self.view.cells.decide_admit(cell, lineages, resource, inputs)
            )
            if isinstance(e, SlotAdmitted)
        )

    def release(self, cell: str, lineage: str, resource: ResourceClass) -> None:
        """Give back ``lineage``'s slot. A release that loses a race to another writer
        on the cell decides again, for as long as the journal's own lock timeout: a
        release never makes room that is not there, so losing is only ever a matter of
        turns, and giving up after a few would leak the slot (the worker is gone, the
        cell still counts it). If another writer released the slot meanwhile, that is
        the release asked for: nothing more is journaled. Past the time limit,
        :class:`SlotReleaseRacedError` says the slot is still held."""
        limit = self.monotonic() + _RELEASE_PATIENCE_S
        stream = f"cell:{cell}"
        first = True
        while first or self.monotonic() < limit:
            version = self.journal.stream_version(stream)
            self.view.refresh(self.journal)
            if not first and lineage not in self.view.cells.get(cell).holders[resource]:
                return  # released by another writer while this one lost its race
            first = False
            event = self._checked(lambda: self.view.cells.decide_release(cell, lineage, resource))
            try:
                committed = self.journal.append([event], expect={stream: version})
            except AppendConflictError:
                continue
            self.view.applied(committed)
            return
        raise SlotReleaseRacedError(
            f"{shown(lineage)} still holds its {resource} slot on cell '{shown(cell)}': "
            f"its release lost every race on the cell for {_RELEASE_PATIENCE_S:.0f} s; "
            "release it again"
        )

    def wait_on_children(self, cell: str, lineage: str) -> None:
        """Give back the processing slot and hold a coordination slot instead. With the
        coordination class full, the swap is refused (journaled, with its retry-after)
        and the coordinator keeps its processing slot."""
        self._pinned(cell, lambda: self.view.cells.decide_wait_on_children(cell, lineage))

    def _checked(self, decide: Callable[[], T]) -> T:
        """``decide()``, a refusal of a slot journaled (once: it leaves the retry loop)
        and a model's complaint turned into bad input."""
        try:
            return decide()
        except AdmissionRefusedError as error:
            if error.refusal is not None:
                self.journal.record_refusal(error.refusal, error)
            raise
        except ValidationError as invalid:
            raise BadInputError(f"{describe_invalid(invalid)}; nothing was journaled") from None

    def _pinned(self, cell: str, decide: Callable[[], tuple[Event, ...]]) -> tuple[Event, ...]:
        stream = f"cell:{cell}"
        for _ in range(_RETRIES * 4):
            version = self.journal.stream_version(stream)
            self.view.refresh(self.journal)
            events = self._checked(decide)
            if not events:  # nothing to do (every holder already holds its slot)
                return events
            try:
                committed = self.journal.append(events, expect={stream: version})
            except AppendConflictError:
                continue
            self.view.applied(committed)
            return events
        raise AppendConflictError(
            f"admission on cell '{shown(cell)}' kept racing; nothing was journaled; retry"
        )
