"""Budgets and slots as command handlers: decide on the folded state, append pinned to
the streams the decision read, refuse (journaled) what the rules do not allow.

:class:`ResourceView` folds the lease book and the cells from the journal incrementally,
timing each entry by its commit time. A fan-out's leases and admissions are stages of
the spawn pipeline (:mod:`charter.control.spawn`), in the fan-out's one append.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import ClassVar, NoReturn, Protocol, TypeVar

from pydantic import ValidationError

from charter.budgets import (
    ADMISSION_EVENTS,
    HOLD_TYPES,
    LEASE_EVENTS,
    AdmissionRefusedError,
    BudgetRefused,
    BudgetSettled,
    CapInputs,
    CellConfigured,
    Cells,
    HeldTokensCharged,
    HeldTokensReleased,
    InsufficientBudgetError,
    LeaseBook,
    LeaseEndedError,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    ResourceClass,
    SlotAdmitted,
    SlotReleaseRacedError,
    TokensHeld,
    UnknownLeaseError,
    UsageRecorded,
)
from charter.control._queue import queue_admissions
from charter.control.handler import Folded, Pinned, append_pinned
from charter.control.load import HostLoad, host_cap_inputs
from charter.core import BadInputError, Budget, Event, RefusedError, describe_invalid, now_ms
from charter.core.budget import budget_of, vec_add, vec_of
from charter.core.errors import InternalError
from charter.core.text import shown
from charter.ledger import (
    AppendConflictError,
    Committed,
    DeadlinePassedError,
    Journal,
    JournalFold,
)

__all__ = [
    "AdmissionService",
    "BudgetService",
    "LivePopulation",
    "ResourceView",
    "Shared",
    "Settling",
    "settle",
]

# How long a slot's release keeps deciding again while it loses races: the journal's
# own write-lock timeout (30 s by default on both backends), so a release gives up no
# sooner than a writer stuck behind the lock would.
_RELEASE_PATIENCE_S = 30.0
E = TypeVar("E", bound=Event)
T = TypeVar("T")
# A caller's events for the same append as a decision, and the stream versions they
# were decided on (read after the decision's own).
Also = Callable[[], tuple[Sequence[Event], Mapping[str, int]]]

_TYPES = (*(cls.type_name for cls in (*LEASE_EVENTS, *ADMISSION_EVENTS)), *HOLD_TYPES)
_HOLD_EVENTS = (TokensHeld, HeldTokensCharged, HeldTokensReleased)


class LivePopulation:
    """How many leases (workers, not durable agents) are live now, kept as the lease
    events are folded, so the fabric's population ceiling costs a decision O(log n) for
    what expired since the last one, never a walk of every lease ever granted.

    A lease is live from its grant until it is released (itself or an ancestor) or its
    expiry passes; a renewal moves its expiry. Expiries are found lazily, with a heap,
    at the time a decision asks.
    """

    def __init__(self) -> None:
        self._open: dict[str, int] = {}  # lineage -> expiry, while not known ended
        self._released: set[str] = set()
        self._children: dict[str, dict[str, None]] = {}  # insertion-ordered sets
        self._expiries: list[tuple[int, str]] = []  # a heap; stale entries skipped

    def apply(self, event: Event, at_ms: int) -> None:
        match event:
            case LeaseGranted():
                self._children.setdefault(event.parent, {}).update(dict.fromkeys(event.lineages))
                if event.parent in self._released:
                    return  # granted under an ended parent: never live (the book agrees)
                for lineage in event.lineages:
                    self._open[lineage] = event.expires_at_ms
                    heapq.heappush(self._expiries, (event.expires_at_ms, lineage))
            case LeaseRenewed():
                if event.lineage not in self._released and at_ms < event.expires_at_ms:
                    # A renewal commits before the old expiry (its deadline), so the lease
                    # is live again even if a query at a later clock had counted it out.
                    self._open[event.lineage] = event.expires_at_ms
                    heapq.heappush(self._expiries, (event.expires_at_ms, event.lineage))
            case LeaseReleased():
                stack = [event.lineage]
                while stack:  # the release ends the whole subtree, as in the book
                    lineage = stack.pop()
                    if lineage in self._released:
                        continue
                    self._released.add(lineage)
                    self._open.pop(lineage, None)
                    stack.extend(self._children.get(lineage, ()))
            case _:
                pass

    def forget(self, lineage: str, parent: str) -> None:
        """``lineage`` ended and left the lease book (LeaseBook.retire): nothing will
        touch it again. An expiry not yet counted out stays until :meth:`live` passes it."""
        self._released.discard(lineage)
        self._children.pop(lineage, None)
        siblings = self._children.get(parent)
        if siblings is not None:
            siblings.pop(lineage, None)
            if not siblings:
                del self._children[parent]

    def live(self, at_ms: int) -> int:
        """Leases live at ``at_ms`` (ask with a clock that does not go back)."""
        heap = self._expiries
        while heap and heap[0][0] <= at_ms:
            expires, lineage = heapq.heappop(heap)
            if self._open.get(lineage) == expires:
                del self._open[lineage]
        return len(self._open)


class ResourceView(JournalFold):
    """The lease book, the cells and the live population, kept current from the journal."""

    types = _TYPES

    def __init__(self) -> None:
        super().__init__()
        self.book = LeaseBook()
        self.cells = Cells()
        self.population = LivePopulation()

    def apply(self, event: Event, position: int, at_ms: int) -> None:
        del position
        # Ended leases nothing can change any more leave the working set first.
        for lineage, parent in self.book.retire(at_ms):
            self.population.forget(lineage, parent)
        if isinstance(event, LEASE_EVENTS):
            self.book.apply(event, at_ms)
            self.population.apply(event, at_ms)
        elif isinstance(event, _HOLD_EVENTS):
            self.book.apply(event, at_ms)
        elif isinstance(event, ADMISSION_EVENTS):
            self.cells.apply(event)


class Shared(Folded, Protocol):
    """The read state a process shares between its handlers (``charter.control.Views``):
    the resource view, one lock, and one refresh that keeps every view current."""

    resources: ResourceView


def settle(journal: Journal, shared: Shared, lineage: str, at_ms: int) -> bool:
    """Make ``lineage``'s children's recent expiries final, when some hold back budget
    at ``at_ms`` only because they came after the last commit the views read (a quiet
    journal: LeaseBook.remaining's ``settled_ms``). A :class:`BudgetSettled` entry is
    committed (under the write lock: whoever held it has committed), and the views read
    up to it: its commit time is the views' settled time, and no entry after it commits
    earlier, whatever any writer's clock says. Returns whether it was needed.

    Journal time, not a clock's reading: a time this host read under the lock and never
    committed bounds nothing another host (or this clock, stepped back) stamps later,
    so a usage stamped before the child's end could still commit after the decision
    read (tests/budgets/test_clock_skew.py). Hold the views' lock; the decision's pins
    still guard what it read."""
    view = shared.resources
    if lineage not in view.book or not view.book.unsettled(lineage, at_ms, view.settled_ms):
        return False
    journal.append([BudgetSettled(lineage=lineage)])
    shared.refresh(journal)
    return True


class Settling:
    """How one decision gets the settled time it needs, across the tries of its
    :func:`append_pinned` loop (one instance per decision).

    :meth:`decide` runs ``decide(settled_ms)`` on the views' settled time. Only if that
    is refused for want of budget that recent expiries of ``lineage``'s children hold
    back (a quiet journal), it decides again taking those ends as final, and pins the
    append to the journal's head as the views read it (:attr:`expect_head`) and to a
    commit time at or after the latest of those ends (:attr:`not_before_ms`): the
    append then commits only if nothing committed since the read, so every charge of
    those children stamped before their end is in what was read
    (docs/decisions-and-views.md). If the decision is made again (the pin lost, or a
    stream moved), it settles the journal instead (:func:`settle`: one more commit):
    under contention a head pin keeps losing, a settle commit does not."""

    pin_head: ClassVar[bool] = True
    """Whether the first try pins the head (tests and benches switch it off to run the
    settle commit alone)."""

    def __init__(self) -> None:
        self.expect_head: int | None = None
        self.not_before_ms: int | None = None
        self._lost = False

    def decide(
        self,
        journal: Journal,
        shared: Shared,
        lineage: str,
        at_ms: int,
        decide: Callable[[int | None], T],
    ) -> T:
        """``decide(settled_ms)``; ``decide(None)`` takes every expiry by ``at_ms`` as
        final (the book's recent expiries are left as they are: a settled time the
        journal has not reached is never handed to it, which drops what it passes)."""
        if self.expect_head is not None:
            self._lost = True  # decided again after a try that pinned the head
        self.expect_head = self.not_before_ms = None
        view = shared.resources
        try:
            return decide(view.settled_ms)
        except InsufficientBudgetError:
            book = view.book
            if lineage not in book or not book.unsettled(lineage, at_ms, view.settled_ms):
                raise
            until = book.settles_at(lineage, at_ms, view.settled_ms)
            if not self.pin_head or self._lost or until is None:
                settle(journal, shared, lineage, at_ms)
                return decide(view.settled_ms)
            decided = decide(None)  # those ends final: true if the pin holds
            self.expect_head, self.not_before_ms = view.position, until
            return decided


class _Own:
    """A handler's private read state, for one built on its own (tests, tools)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.resources = ResourceView()

    def refresh(self, journal: Journal) -> None:
        self.resources.refresh(journal)

    def applied(self, committed: Sequence[Committed]) -> None:
        self.resources.applied(committed)


class BudgetService:
    """Usage, release and renewal of leases: decide on the folded state, append pinned
    to the stream the decision read, refuse (journaled) what the book does not allow."""

    def __init__(
        self,
        journal: Journal,
        clock: Callable[[], int] = now_ms,
        *,
        shared: Shared | None = None,
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.shared = shared or _Own()
        self.view = self.shared.resources

    def remaining(self, lineage: str, at_ms: int | None = None) -> Budget:
        """What ``lineage`` holds now (or at ``at_ms``), from the journal as it stands."""
        with self.shared.lock:
            self.shared.refresh(self.journal)
            return self.view.book.remaining(lineage, self.clock() if at_ms is None else at_ms)

    def record_usage(
        self,
        lineage: str,
        amount: Budget,
        then: Also | None = None,
        *,
        holds: Collection[str] = (),
    ) -> UsageRecorded:
        """Charge ``amount`` to ``lineage``'s lease; ``then`` adds the caller's events to
        the same append, as for :meth:`release` (the model door settles a call and
        charges its tokens in one commit). ``holds``: the lease's holds of tokens
        (:mod:`charter.budgets.holds`) the charge draws from besides its remainder (the
        blocks the calls were settled on; ``then`` pins their streams)."""

        decide = self._usage(lineage, amount, tuple(holds))
        return self._decide_and_append("usage", lineage, decide, then)

    def _usage(
        self, lineage: str, amount: Budget, holds: tuple[str, ...]
    ) -> Callable[[int], UsageRecorded]:
        def decide(now: int) -> UsageRecorded:
            book = self.view.book
            available = book.remaining(lineage, now, self.view.settled_ms)
            if holds:
                available = budget_of(
                    vec_add(vec_of(available), (book.held(lineage, holds), 0, 0, 0, 0))
                )
            fits = amount.fits_within(available)
            if not fits:  # clamped otherwise: recent expiries of its children may hold some back
                settle(self.journal, self.shared, lineage, now)
            return book.decide_usage(
                lineage,
                amount,
                now,
                settled_ms=self.view.settled_ms,
                available=available if fits else None,  # else read again, once settled
                holds=() if fits else holds,
            )

        return decide

    def release(
        self, lineage: str, then: Also | None = None, *, usage: Budget | None = None
    ) -> LeaseReleased:
        """Return ``lineage``'s lease. ``then`` adds the caller's own events to the same
        append, decided on its own pinned streams after the lease's were read (the cell
        returns a worker's lease and ends it in one commit); on a conflict with either,
        both are decided again. ``usage`` is charged to the lease first, in the same
        append (the cell charges what a worker used as it returns its lease): a lease
        that cannot take it cannot be returned either, so a refusal then is journaled
        for both operations (the usage's, then the release's) and raised."""
        charge = None if usage is None else self._usage(lineage, usage, ())
        return self._decide_and_append(
            "release",
            lineage,
            lambda now: self.view.book.decide_release(lineage, now),
            then,
            charge=charge,
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
        *,
        charge: Callable[[int], UsageRecorded] | None = None,
    ) -> E:
        with self.shared.lock:  # the views are shared: one decision at a time
            book = self.view.book
            # A lease the views know stays known (an ended one as retired): only an
            # unknown name needs the journal read first. The decision itself is made
            # on views refreshed after its streams' versions (append_pinned).
            known = lineage in book or book.retired(lineage)  # ended leases are refused
            if not known:
                self.shared.refresh(self.journal)
                known = lineage in book or book.retired(lineage)
        if not known:  # a typo is not a policy decision: not journaled
            raise UnknownLeaseError(
                f"no lease or budget ledger for {shown(lineage)} in the journal; nothing "
                "was journaled (`charter budgets` lists the lineages that have one)"
            )
        made: list[E] = []

        def attempt(versions: dict[str, int]) -> Pinned:
            also, pins = then() if then is not None else ((), {})
            now = self.clock()
            try:
                charged = () if charge is None else (charge(now),)
                event = decide(now)
            except ValidationError as invalid:  # a value no event can carry
                raise BadInputError(
                    f"{operation} of {shown(lineage)}: {describe_invalid(invalid)}; "
                    "nothing was journaled"
                ) from None
            made.append(event)
            # Usage, release and renewal all rely on the lease (and every ancestor's)
            # being live: the journal refuses, under its write lock, to commit them at
            # or after the first of those expiries. (A release that commits later would
            # record the end of a lease that had already ended, later than it ended.)
            deadline = self.view.book.deadline(lineage)
            return Pinned([*charged, event, *also], {**versions, **pins}, deadline)

        try:
            # The handlers' one loop: a usage, release or renewal is pinned to every
            # stream of its chain, so a busy ancestor (fanning out, spending) moves one
            # of them often; it is decided again each time.
            append_pinned(
                self.journal,
                self.shared,
                self._streams(operation, lineage),
                attempt,
                what=f"{operation} of {shown(lineage)}",
            )
        except DeadlinePassedError as e:
            operations = ("usage", operation) if charge is not None else (operation,)
            self._refuse(
                operations,
                lineage,
                LeaseEndedError(
                    f"{shown(lineage)}'s lease (or an ancestor's) ended before the "
                    f"{' and '.join(operations)} could commit; nothing was journaled for "
                    f"it ({e})"
                ),
            )
        except RefusedError as error:
            operations = ("usage", operation) if charge is not None else (operation,)
            self._refuse(operations, lineage, error)
        return made[-1]

    def _refuse(self, operations: tuple[str, ...], lineage: str, error: RefusedError) -> NoReturn:
        """Journal a refusal of each of ``operations`` (asked in one append, refused
        together) with its stable reason code, then raise it."""
        for operation in operations:
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
            self.shared.refresh(self.journal)
        if lineage not in self.view.book:
            return [lineage]  # the decision refuses it, with its named reason
        return [ledger.lineage for ledger in self.view.book.chain(lineage)]


Live = Callable[[str], bool]
"""Whether a holder's worker is still live (the cell's workers view): a queued worker
killed meanwhile is admitted and released at once, which clears it from the queue."""


def _everyone_live(lineage: str) -> bool:
    del lineage
    return True


class AdmissionService:
    """Slots on cells, each change appended pinned to the cell's stream (so no two
    admitters take the last slot), through :func:`append_pinned`: configuring caps,
    admitting (all or none), and the cell's own moves: admitting its queue into room
    it has, a coordinator's swap to a coordination slot and back, and the settlement
    of a worker's end (its slots back, the queue's head admitted).

    Every refusal of a slot (an admission, a coordinator's swap) is journaled once, with
    its retry-after; a model's complaint about a value reaches the caller as bad input.
    Admission of one holder is idempotent. Giving slots back (:meth:`release`,
    :meth:`settle`) keeps deciding again while it loses races, for as long as the
    journal's own lock timeout: giving up after a few tries would leak the slot."""

    def __init__(
        self,
        journal: Journal,
        view: ResourceView | None = None,
        *,
        shared: Shared | None = None,
        host_load: HostLoad = host_cap_inputs,
        monotonic: Callable[[], float] = time.monotonic,
        peers: Callable[[str], int] = lambda _cell: 0,
    ) -> None:
        """``peers``: how many other live cells share a cell's host (the adaptive
        cap's ``live_peers``; the composition root counts them from the cells' claims,
        :class:`charter.control.placement.Liveness`)."""
        self.journal = journal
        self.peers = peers
        self.monotonic = monotonic
        if shared is None:
            shared = _Own()
            if view is not None:
                shared.resources = view
        self.shared = shared
        self.view = shared.resources
        self.host_load = host_load

    def configure(
        self, cell: str, caps: dict[ResourceClass, int], *, cores: int, failover_reserve: int
    ) -> CellConfigured:
        event = self.view.cells.decide_configure  # decided on the views as they stand then
        done = self._pinned(
            cell,
            lambda: (event(cell, caps, cores=cores, failover_reserve=failover_reserve),),
        )
        (configured,) = done
        if not isinstance(configured, CellConfigured):  # decide_configure makes only that
            raise InternalError(f"decide_configure made {type(configured).__name__}")
        return configured

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
        holds only the new admissions, and is empty, with nothing appended, when there
        are none)."""
        done = self._pinned(
            cell, lambda: self.view.cells.decide_admit(cell, lineages, resource, inputs)
        )
        return tuple(e for e in done if isinstance(e, SlotAdmitted))

    def release(self, cell: str, lineage: str, resource: ResourceClass) -> None:
        """Give back ``lineage``'s slot of ``resource``. If another writer released it
        while this release lost its race, that is the release asked for: nothing more
        is journaled."""
        first = True

        def decide(versions: dict[str, int]) -> Pinned | None:
            nonlocal first
            if not first and lineage not in self.view.cells.get(cell).holders[resource]:
                return None  # released by another writer while this one lost its race
            first = False
            return Pinned([self.view.cells.decide_release(cell, lineage, resource)], versions)

        self._patiently(cell, lineage, decide)

    # -- the cell's moves ------------------------------------------------------------

    def admit_queued(
        self, cell: str, live: Live = _everyone_live, *, freed: int = 0, dead: Collection[str] = ()
    ) -> list[Event]:
        """Admissions of ``cell``'s processing queue head(s) (:func:`queue_admissions`)
        on the views as they stand (hold the lock)."""
        cells = self.view.cells
        inputs = self.cap_inputs(cell)
        return queue_admissions(cells, cell, inputs, live, freed=freed, dead=dead)

    def cap_inputs(self, cell: str) -> CapInputs:
        """The adaptive cap's inputs for ``cell`` (configured): this host's load, and
        its live peers."""
        state = self.view.cells.get(cell)
        inputs = self.host_load(state.cores, state.failover_reserve)
        return inputs.model_copy(update={"live_peers": inputs.live_peers + self.peers(cell)})

    def admit_room(self, cell: str, live: Live = _everyone_live) -> bool:
        """Admit queued workers into room no release will announce (a fan-out queued
        while the host was loaded, or before the cell was configured); True if any."""

        def decide(versions: dict[str, int]) -> Pinned | None:
            state = self.view.cells.cells().get(cell)
            if state is None or not state.caps or not state.queued[ResourceClass.PROCESSING]:
                return None
            return Pinned(self.admit_queued(cell, live), versions)

        return self._append(cell, decide) is not None

    def settlement(
        self, cell: str, lineage: str, extra: Sequence[Event] = (), live: Live = _everyone_live
    ) -> tuple[list[Event], dict[str, int]]:
        """``extra``, every slot ``lineage`` holds on ``cell`` given back, and the
        processing queue's head(s) admitted into the room there is (never over the
        cap); with the cell stream's version, read before the views, to pin the append
        to (hold the lock until it commits)."""
        version = self.journal.stream_version(f"cell:{cell}")
        self.shared.refresh(self.journal)
        return self._settlement(cell, lineage, extra, live), {f"cell:{cell}": version}

    def _settlement(
        self, cell: str, lineage: str, extra: Sequence[Event], live: Live
    ) -> list[Event]:
        cells = self.view.cells
        state = cells.get(cell)
        held = [r for r in ResourceClass if lineage in state.holders[r]]
        events: list[Event] = list(extra)
        events.extend(cells.decide_release(cell, lineage, r) for r in held)
        freed = 1 if ResourceClass.PROCESSING in held else 0
        events.extend(self.admit_queued(cell, live, freed=freed, dead={lineage}))
        return events

    def settle(
        self, cell: str, lineage: str, extra: Sequence[Event] = (), live: Live = _everyone_live
    ) -> tuple[Committed, ...]:
        """:meth:`settlement`, appended pinned to the cell's stream (decided again while
        it loses races, like :meth:`release`: the worker is gone, its slots must not
        stay counted)."""
        # Pinned to the cell's version: the settlement admits the queue's head into
        # the room it makes, which must not be decided on a stale view.
        done = self._patiently(
            cell,
            lineage,
            lambda versions: Pinned(self._settlement(cell, lineage, extra, live), versions),
        )
        return () if done is None else done[1]

    def wait_on_children(
        self, cell: str, lineage: str, waiting: Event | None = None, live: Live = _everyone_live
    ) -> None:
        """A coordinator waits on its children (``waiting`` says on which): it gives
        back its processing slot, which goes to the queue's head at once, and holds a
        coordination slot instead, so deep trees never deadlock on processing slots.
        With the coordination class full, the swap is refused (journaled once, with
        its retry-after) and the coordinator keeps its processing slot."""

        def decide(versions: dict[str, int]) -> Pinned:
            swap = self.view.cells.decide_wait_on_children(cell, lineage)
            said = () if waiting is None else (waiting,)
            return Pinned([*said, *swap, *self.admit_queued(cell, live, freed=1)], versions)

        self._append(cell, decide)

    def resume_processing(self, cell: str, lineage: str) -> None:
        """The coordinator's children ended: give back its coordination slot and take
        (or queue for) a processing one."""

        def decide(versions: dict[str, int]) -> Pinned:
            cells = self.view.cells
            release = cells.decide_release(cell, lineage, ResourceClass.COORDINATION)
            inputs = self.cap_inputs(cell)
            placed = cells.decide_place(cell, [lineage], ResourceClass.PROCESSING, inputs)
            return Pinned([release, *placed], versions)

        self._append(cell, decide)

    def _append(
        self, cell: str, decide: Callable[[dict[str, int]], Pinned | None]
    ) -> tuple[Pinned, tuple[Committed, ...]] | None:
        def checked(versions: dict[str, int]) -> Pinned | None:
            """The decision, with a refusal of a slot journaled (once: a refusal leaves
            the retry loop) and a model's complaint turned into bad input."""
            try:
                return decide(versions)
            except AdmissionRefusedError as error:
                if error.refusal is not None:
                    self.journal.record_refusal(error.refusal, error)
                raise
            except ValidationError as invalid:
                raise BadInputError(
                    f"cell '{shown(cell)}': {describe_invalid(invalid)}; nothing was journaled"
                ) from None

        return append_pinned(
            self.journal,
            self.shared,
            [f"cell:{cell}"],
            checked,
            what=f"admission on cell '{shown(cell)}'",
        )

    def _patiently(
        self, cell: str, lineage: str, decide: Callable[[dict[str, int]], Pinned | None]
    ) -> tuple[Pinned, tuple[Committed, ...]] | None:
        """:meth:`_append` for giving slots back: a lost race only means another writer
        committed on the cell, and a release never makes room that is not there, so it
        is decided again for up to the journal's lock timeout before
        :class:`SlotReleaseRacedError` says the slot is still held."""
        limit = self.monotonic() + _RELEASE_PATIENCE_S
        while True:
            try:
                return self._append(cell, decide)
            except AppendConflictError:
                if self.monotonic() >= limit:
                    raise SlotReleaseRacedError(
                        f"{shown(lineage)} still holds its slot(s) on cell '{shown(cell)}': "
                        f"giving them back lost every race on the cell for "
                        f"{_RELEASE_PATIENCE_S:.0f} s; release them again"
                    ) from None

    def _pinned(self, cell: str, decide: Callable[[], tuple[Event, ...]]) -> tuple[Event, ...]:
        done = self._append(cell, lambda versions: Pinned(decide(), versions))
        return () if done is None else tuple(done[0].events)
