"""Budget ledgers and leases: what each agent may still spend, as a pure fold.

A durable agent's budget ledger is opened with an allocation. A child's allocation is a
time-limited **lease** carved out of its parent's remaining budget, appended in the same
transaction as its mint. Usage is recorded against a lease; releasing it, or its expiry,
returns the unspent part to the parent. There is no sweeper: the remaining budget at a
journal position is :meth:`LeaseBook.remaining` of the events up to that position,
evaluated at that position's commit time. The invariant the book keeps, on every axis:

    own spend + Σ (children's charges) ≤ allocation

where a live child is charged its whole allocation and an ended one only what its
subtree spent. Tokens held for calls (:mod:`charter.budgets.holds`) count against the
remainder too, until released, less what the calls settled on them charged.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import Field, model_validator

from charter.budgets import formula
from charter.budgets.errors import (
    ExpiryOutOfRangeError,
    InsufficientBudgetError,
    LeaseEndedError,
    NoBudgetLedgerError,
    RenewalBeyondGrantError,
    RenewalBeyondParentError,
)
from charter.budgets.holds import HeldTokensCharged, HeldTokensReleased, TokensHeld
from charter.core.budget import (
    INT64_MAX,
    VEC_ZERO,
    Budget,
    Vec,
    budget_of,
    vec_add,
    vec_min,
    vec_of,
    vec_sat_sub,
    vec_sub,
)
from charter.core.errors import BadInputError, StateError
from charter.core.events import Event
from charter.core.text import shown

__all__ = [
    "BudgetLedgerOpened",
    "LeaseGranted",
    "UsageRecorded",
    "LeaseReleased",
    "LeaseRenewed",
    "BudgetRefused",
    "BudgetSettled",
    "LEASE_EVENTS",
    "LeaseBook",
    "LedgerState",
    "MAX_EXPIRY_MS",
    "render_instant",
]

_EPOCH, _MS = datetime(1970, 1, 1, tzinfo=UTC), timedelta(milliseconds=1)

MAX_EXPIRY_MS = (datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC) - _EPOCH) // _MS
"""The latest instant a lease may end at: the last millisecond of year 9999, the last
one a date can be written for (Python's datetime, ISO 8601 with four-digit years). The
events accept up to 2^63 − 1 (what the databases store, so an old journal still reads);
decisions never make a lease end later, so every end they journal renders."""


def render_instant(ms: int) -> str:
    """``ms`` (epoch milliseconds) as a UTC date, or as plain milliseconds when it lies
    outside what a date can show (a journal written before the bound): never raises."""
    if 0 <= ms <= MAX_EXPIRY_MS:
        return f"{_EPOCH + ms * _MS:%Y-%m-%d %H:%M:%S}Z"
    return f"{ms} ms after the epoch"


# -- events ------------------------------------------------------------------------


class BudgetLedgerOpened(Event):
    """A durable agent's budget: its allocation, with no parent to return it to."""

    type_name = "BudgetLedgerOpened"
    lineage: str
    allocation: Budget

    def stream(self) -> str:
        return self.lineage


class LeaseGranted(Event):
    """Leases carved out of a parent's remaining budget: each of ``lineages`` holds
    ``allocation`` until ``expires_at_ms``. One event per fan-out (its children's leases
    are identical), appended with its mints.

    On the parent's stream: the append is pinned to the version the split was decided
    on, so two concurrent fan-outs cannot both spend the same remainder.
    """

    type_name = "LeaseGranted"
    parent: str
    lineages: tuple[str, ...] = Field(min_length=1)
    allocation: Budget
    expires_at_ms: int = Field(ge=0, le=INT64_MAX)
    # The fan-out the leases belong to, and each child's sealed-grant digest (hex, in
    # the order of ``lineages``): the grant says exactly what the lease does.
    fanout: str | None = None
    grants: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one_digest_per_child(self) -> LeaseGranted:
        if self.grants and len(self.grants) != len(self.lineages):
            raise ValueError("a lease event names one grant digest per child, or none")
        return self

    def stream(self) -> str:
        return self.parent


class UsageRecorded(Event):
    """Consumption charged to a lease (clamped to what it holds; ``exhausted`` says it
    reached its allocation on some axis, ``refused`` what could not be charged)."""

    type_name = "UsageRecorded"
    lineage: str
    amount: Budget
    refused: Budget
    exhausted: bool

    def stream(self) -> str:
        return self.lineage


class LeaseReleased(Event):
    """The lease ends now (with its whole subtree); its unspent part returns."""

    type_name = "LeaseReleased"
    lineage: str

    def stream(self) -> str:
        return self.lineage


class LeaseRenewed(Event):
    """The lease now expires later, never later than its parent's."""

    type_name = "LeaseRenewed"
    lineage: str
    parent: str
    expires_at_ms: int = Field(ge=0, le=INT64_MAX)

    def stream(self) -> str:
        return self.parent


class BudgetRefused(Event):
    """A budget operation refused by policy, with its stable reason code."""

    type_name = "BudgetRefused"
    lineage: str
    operation: str
    reason: str
    message: str


class BudgetSettled(Event):
    """Journal time moved on, for a decision about ``lineage``'s budget: its children's
    expiries up to this entry's commit time are final, since no entry after it commits
    earlier (commit times never decrease with position). Appended only when recent
    expiries would otherwise hold back budget the decision needs on a quiet journal."""

    type_name = "BudgetSettled"
    lineage: str


LEASE_EVENTS = (BudgetLedgerOpened, LeaseGranted, UsageRecorded, LeaseReleased, LeaseRenewed)


# -- the fold ----------------------------------------------------------------------


def _ended_at(ledger: LedgerState) -> int | None:
    """When ``ledger``'s lease ended (its release or its expiry; None: a durable one's)."""
    ends = [x for x in (ledger.released_at_ms, ledger.expires_at_ms) if x is not None]
    return min(ends, default=None)


def _child_number(lineage: str, parent: str) -> int | None:
    """``N`` if ``lineage`` is ``<parent>/sa-N``, else None."""
    head, sep, number = lineage.rpartition("/sa-")
    if not sep or head != parent or not number.isascii() or not number.isdigit():
        return None
    return int(number)


def _covers(ranges: list[int], n: int) -> bool:
    """Whether ``n`` lies in one of the flat inclusive ranges."""
    i = bisect.bisect_right(ranges, n)
    return i % 2 == 1 or (i > 0 and ranges[i - 1] == n)


def _mark(ranges: list[int], n: int) -> None:
    """Add ``n`` to the flat inclusive ranges, merging neighbours."""
    if _covers(ranges, n):
        return
    i = bisect.bisect_right(ranges, n)  # even: n lies between ranges i-1 and i
    joins_left = i > 0 and ranges[i - 1] == n - 1
    joins_right = i < len(ranges) and ranges[i] == n + 1
    if joins_left and joins_right:
        del ranges[i - 1 : i + 1]
    elif joins_left:
        ranges[i - 1] = n
    elif joins_right:
        ranges[i] = n
    else:
        ranges[i:i] = [n, n]


ZERO = Budget.zero()  # frozen, so one instance serves every new ledger


@dataclass
class LedgerState:
    """One agent's ledger as folded so far (mutable only inside :class:`LeaseBook`).

    Besides its own facts, a ledger keeps what its children cost it, split in two
    running sums so a fan-out's check does not walk every earlier child: ``live`` (the
    allocations of children not known to have ended) and ``ended`` (what ended children
    spent). ``horizon_ms`` is the latest time those sums are exact from; expiries up to
    a query time are moved from ``live`` to ``ended`` as it advances.
    """

    lineage: str
    parent: str | None
    allocation: Budget
    expires_at_ms: int | None  # None: a durable agent's ledger does not expire
    # The end of the sealed grant the lease was granted under (None: no grant named).
    # A grant is its lease (decision 0005): the mint gives each child's grant the
    # lease's terms, so the expiry a LeaseGranted that names grants carries is theirs.
    grant_end_ms: int | None = None
    spent: Budget = ZERO
    subtree_spent: Budget = ZERO
    released_at_ms: int | None = None
    exhausted: bool = False
    children: dict[str, None] = field(default_factory=dict)  # an insertion-ordered set
    live: Vec = VEC_ZERO
    ended: Vec = VEC_ZERO
    horizon_ms: int = 0
    expiries: list[tuple[int, str]] = field(default_factory=list)  # a heap
    counted_live: bool = True  # in its parent's ``live`` sum (else in ``ended``)
    ended_charge: Vec = VEC_ZERO  # its share of its parent's ``ended`` sum
    # Children ended by their expiry, in expiry order, while that end may not be final
    # yet (see LeaseBook.remaining's ``settled_ms``).
    expired: deque[tuple[int, str]] = field(default_factory=deque)
    # Children that left the book (LeaseBook.retire): their numbers (``sa-N``) as sorted
    # inclusive ranges, flat ``[lo, hi, lo, hi, …]``; the sum of their final charges
    # (already in ``ended``) and of their allocations; the latest of their ends.
    retired: list[int] = field(default_factory=list)
    retired_charge: Vec = VEC_ZERO
    retired_allocation: Vec = VEC_ZERO
    retired_until_ms: int = 0
    # Its holds of tokens not released (hold -> what it still holds: its tokens less
    # what the calls settled on it charged, floored at 0), and their sum.
    holds: dict[str, int] = field(default_factory=dict)
    held: int = 0

    def active(self, at_ms: int) -> bool:
        return formula.is_active(self.released_at_ms, self.expires_at_ms, at_ms)


class LeaseBook:
    """All budget ledgers, folded from lease events in journal order.

    Ended leases leave the book once nothing can change them (:meth:`retire`): what
    they cost their parent stays in its sums, and their names stay known as ranges of
    child numbers, so the book's size follows the live leases, not the history.
    """

    def __init__(self) -> None:
        self._ledgers: dict[str, LedgerState] = {}
        # (end, lineage) of every lease that may have ended by then: a heap, with stale
        # entries (renewed since) skipped when they come up.
        self._ends: list[tuple[int, str]] = []

    def __contains__(self, lineage: str) -> bool:
        return lineage in self._ledgers

    def ledgers(self) -> Iterator[LedgerState]:
        return iter(self._ledgers.values())

    def get(self, lineage: str) -> LedgerState:
        ledger = self._ledgers.get(lineage)
        if ledger is None:
            if self.retired(lineage):
                raise LeaseEndedError(f"{shown(lineage)}'s lease has ended")
            raise NoBudgetLedgerError(
                f"{shown(lineage)} has no budget ledger, so it cannot spend or spawn; open one "
                "(charter init / agent add --budget) or spawn it with a lease"
            )
        return ledger

    # -- applying committed events (pure: time comes from the entry) --------------

    def apply(self, event: Event, at_ms: int) -> None:
        """Fold one committed event, recorded at ``at_ms``."""
        if not (self._ledgers and self._touches_retired(event)):
            self._fold(event, at_ms)

    def _fold(self, event: Event, at_ms: int) -> None:
        match event:
            case BudgetLedgerOpened():
                # Write-once, as the auditor reads it: a second ledger for a lineage (only
                # a database writer could append one; register_root pins the stream)
                # never replaces the first one's allocation or what was spent under it.
                self._ledgers.setdefault(
                    event.lineage, LedgerState(event.lineage, None, event.allocation, None)
                )
            case LeaseGranted():
                parent = self._ledgers[event.parent]
                n = len(event.lineages)
                parent.live = vec_add(parent.live, tuple(n * x for x in vec_of(event.allocation)))  # type: ignore[arg-type]
                expires = event.expires_at_ms
                grants = event.grants or ("",) * n
                for lineage, digest in zip(event.lineages, grants, strict=True):
                    # A child named with its grant's digest ends with that grant.
                    grant_end = expires if digest else None
                    self._ledgers[lineage] = LedgerState(
                        lineage, event.parent, event.allocation, expires, grant_end
                    )
                    heapq.heappush(parent.expiries, (expires, lineage))
                    heapq.heappush(self._ends, (expires, lineage))
                parent.children.update(dict.fromkeys(event.lineages))
            case UsageRecorded():
                ledger = self._ledgers[event.lineage]
                # Sums on vectors: a fold never fails on events the models accept. Usage
                # is clamped when decided, so a sum past 2^63 − 1 means a journal that
                # broke the invariant (the auditor's finding to report), and a Budget
                # would refuse it halfway through the fold.
                amount = vec_of(event.amount)
                ledger.spent = budget_of(vec_add(vec_of(ledger.spent), amount))
                ledger.exhausted = ledger.exhausted or event.exhausted
                node: LedgerState | None = ledger
                while node is not None:
                    node.subtree_spent = budget_of(vec_add(vec_of(node.subtree_spent), amount))
                    if not node.counted_live:  # an ended child's charge follows its spend
                        self._recharge(node)
                    node = self._ledgers.get(node.parent) if node.parent else None
            case LeaseReleased():
                for ledger in self._subtree(event.lineage):
                    if ledger.released_at_ms is None:
                        ledger.released_at_ms = at_ms
                        self._end(ledger, at_ms)
                        heapq.heappush(self._ends, (at_ms, ledger.lineage))
            case TokensHeld() | HeldTokensCharged() | HeldTokensReleased():
                self._fold_hold(event)
            case LeaseRenewed():
                ledger = self._ledgers[event.lineage]
                ledger.expires_at_ms = event.expires_at_ms
                parent = self._ledgers[event.parent]
                if not ledger.counted_live and ledger.released_at_ms is None:
                    # ended by an expiry the sums had already passed: live again
                    parent.ended = vec_sub(parent.ended, ledger.ended_charge)
                    parent.live = vec_add(parent.live, vec_of(ledger.allocation))
                    ledger.counted_live, ledger.ended_charge = True, VEC_ZERO
                heapq.heappush(parent.expiries, (event.expires_at_ms, event.lineage))
                heapq.heappush(self._ends, (event.expires_at_ms, event.lineage))

    def _fold_hold(self, event: Event) -> None:
        """A hold of a lease's tokens, a charge settled on it, or its release (a lease
        that left the book, or one it never had, holds nothing)."""
        match event:
            case TokensHeld():
                hold, lineage, tokens = event.hold()
                ledger = self._ledgers.get(lineage)
                if ledger is not None and hold not in ledger.holds:  # write-once
                    ledger.holds[hold] = tokens
                    ledger.held += tokens
            case HeldTokensCharged():
                drawn = event.charged_from()
                ledger = self._ledgers.get(drawn[1]) if drawn is not None else None
                if drawn is not None and ledger is not None and drawn[0] in ledger.holds:
                    left = ledger.holds[drawn[0]]
                    ledger.holds[drawn[0]] = max(left - drawn[2], 0)
                    ledger.held -= left - ledger.holds[drawn[0]]
            case HeldTokensReleased():
                hold, lineage = event.released_hold()
                ledger = self._ledgers.get(lineage)
                if ledger is not None and hold in ledger.holds:
                    ledger.held -= ledger.holds.pop(hold)
            case _:
                pass

    # -- retiring ended leases -----------------------------------------------------

    def _touches_retired(self, event: Event) -> bool:
        """Fold an event about a lease that has left the book, fail closed (True), or
        say it is not one (False). The journal commits none (its deadline and stream
        pins refuse them), so only a journal that broke those rules holds one, which
        the auditor reports: a usage is charged in full to the nearest ancestor still
        in the book (never clamped to the lease, so never less than the book would
        have charged); leases granted under an ended lease get no ledger (they cannot
        spend or spawn); a release or a renewal of an ended lease changes nothing."""
        match event:
            case UsageRecorded(lineage=lineage) if lineage not in self._ledgers:
                if not self.retired(lineage):
                    return False
                self._late_usage(lineage, vec_of(event.amount))
                return True
            case LeaseGranted(parent=lineage) | LeaseReleased(lineage=lineage):
                return lineage not in self._ledgers and self.retired(lineage)
            case LeaseRenewed(lineage=lineage):
                return lineage not in self._ledgers and self.retired(lineage)
            case _:
                return False

    def _late_usage(self, lineage: str, amount: Vec) -> None:
        """Charge ``amount`` spent under the retired ``lineage`` to the nearest
        ancestor still in the book, and up its chain as a usage is."""
        node: LedgerState | None = None
        while node is None:
            lineage = lineage.rpartition("/")[0]
            node = self._ledgers.get(lineage)
        node.ended = vec_add(node.ended, amount)  # the retired child's charge grows
        node.retired_charge = vec_add(node.retired_charge, amount)
        while node is not None:
            node.subtree_spent = budget_of(vec_add(vec_of(node.subtree_spent), amount))
            if not node.counted_live:
                self._recharge(node)
            node = self._ledgers.get(node.parent) if node.parent else None

    def retire(self, at_ms: int) -> list[tuple[str, str]]:
        """Take out of the book every lease that ended at or before ``at_ms``, the
        commit time of the entry about to be folded; return ``(lineage, parent)`` of
        each (a caller's own folds forget them too).

        Nothing can change such a lease any more: its usage, renewal and release (and
        every descendant's, and a fan-out under it) are pinned to its stream or
        committed before its end, which the journal checks against the commit time
        under its write lock, and commit times never decrease with position; so every
        entry that touches it was folded before this one. What it cost its parent is
        final and stays in the parent's ``ended`` sum; its name stays known (its number
        in the parent's ``retired`` ranges), so a decision about it is still refused as
        one about an ended lease. Only children numbered ``<parent>/sa-N`` (the
        lineages Charter mints) leave; a durable agent's ledger never does."""
        gone: list[tuple[str, str]] = []
        ends = self._ends
        while ends and ends[0][0] <= at_ms:
            _, lineage = heapq.heappop(ends)
            ledger = self._ledgers.get(lineage)
            if ledger is not None:
                self._retire(ledger, at_ms, gone)
        return gone

    def _retire(self, ledger: LedgerState, at_ms: int, gone: list[tuple[str, str]]) -> bool:
        """Retire ``ledger``'s subtree, children first; False (kept) if any of it has not
        ended by ``at_ms`` or is not named as a child of its parent."""
        end = _ended_at(ledger)
        if ledger.parent is None or end is None or end > at_ms:
            return False
        number = _child_number(ledger.lineage, ledger.parent)
        if number is None:
            return False
        for child in list(ledger.children):
            below = self._ledgers.get(child)
            if below is not None and not self._retire(below, at_ms, gone):
                return False
        parent = self._ledgers[ledger.parent]
        if ledger.counted_live:  # expired, and no query has moved it yet
            self._end(ledger, end)
        del self._ledgers[ledger.lineage]
        del parent.children[ledger.lineage]
        _mark(parent.retired, number)
        parent.retired_charge = vec_add(parent.retired_charge, ledger.ended_charge)
        parent.retired_allocation = vec_add(parent.retired_allocation, vec_of(ledger.allocation))
        parent.retired_until_ms = max(parent.retired_until_ms, end)
        recent = parent.expired  # final by now (see _unsettled)
        while recent and recent[0][0] <= at_ms:
            recent.popleft()
        if len(parent.expiries) > 2 * len(parent.children) + 16:  # drop what left
            parent.expiries = [e for e in parent.expiries if e[1] in parent.children]
            heapq.heapify(parent.expiries)
        gone.append((ledger.lineage, ledger.parent))
        return True

    def retired(self, lineage: str) -> bool:
        """Whether ``lineage`` was a lease that has ended and left the book (or lies
        under one that has: everything under an ended lease has ended)."""
        if lineage in self._ledgers:
            return False
        parent, sep, _ = lineage.rpartition("/")
        number = _child_number(lineage, parent) if sep else None
        if number is None:
            return False
        ledger = self._ledgers.get(parent)
        if ledger is None:
            return self.retired(parent)
        return _covers(ledger.retired, number)

    def _end(self, ledger: LedgerState, at_ms: int) -> None:
        """Move ``ledger`` from its parent's live sum to its ended sum, as of ``at_ms``."""
        if ledger.parent is None or not ledger.counted_live:
            return
        parent = self._ledgers[ledger.parent]
        parent.live = vec_sub(parent.live, vec_of(ledger.allocation))
        ledger.counted_live = False
        ledger.ended_charge = VEC_ZERO
        self._recharge(ledger)
        parent.horizon_ms = max(parent.horizon_ms, at_ms)

    def _recharge(self, ledger: LedgerState) -> None:
        """An ended child costs its parent what its subtree spent (never more than its
        allocation)."""
        if ledger.parent is None:
            return
        parent = self._ledgers[ledger.parent]
        charge = formula.charge(vec_of(ledger.allocation), vec_of(ledger.subtree_spent), False)
        parent.ended = vec_add(vec_sub(parent.ended, ledger.ended_charge), charge)
        ledger.ended_charge = charge

    def _advance(self, ledger: LedgerState, at_ms: int) -> None:
        """End every child whose lease expired at or before ``at_ms``."""
        heap = ledger.expiries
        while heap and heap[0][0] <= at_ms:
            expires, lineage = heapq.heappop(heap)
            child = self._ledgers.get(lineage)
            if child is not None and child.counted_live and child.expires_at_ms == expires:
                self._end(child, expires)
                ledger.expired.append((expires, lineage))
        ledger.horizon_ms = max(ledger.horizon_ms, at_ms)

    def _unsettled(self, ledger: LedgerState, settled_ms: int) -> Vec:
        """What ``ledger``'s children that expired after ``settled_ms`` may still cost
        beyond what they are known to have spent: the rest of their allocation.

        A usage (or renewal) of a child is stamped under the journal's write lock before
        the child's end, but may commit after a reader looked: every entry a reader has
        not seen yet is stamped at or after the last one it has seen (``settled_ms``).
        So a child that expired after ``settled_ms`` may still be charged more, and a
        decision counts it as live. Entries at or before ``settled_ms`` are final and
        dropped (callers pass a ``settled_ms`` that never decreases)."""
        total = VEC_ZERO
        for _, held in self._held_back(ledger, settled_ms):
            total = vec_add(total, held)
        return total

    def _held_back(self, ledger: LedgerState, settled_ms: int) -> Iterator[tuple[int, Vec]]:
        """``(expiry, what it holds back)`` of each child of ``ledger`` that expired after
        ``settled_ms`` and may still be charged (in expiry order)."""
        recent = ledger.expired
        while recent and recent[0][0] <= settled_ms:
            recent.popleft()
        for expires, lineage in recent:
            child = self._ledgers.get(lineage)
            if child is None:  # retired: its end was final
                continue
            if child.released_at_ms is None and child.expires_at_ms == expires:
                held = vec_sub(vec_of(child.allocation), child.ended_charge)
                if held != VEC_ZERO:
                    yield expires, held

    def _subtree(self, lineage: str) -> Iterator[LedgerState]:
        stack = [lineage]
        while stack:
            ledger = self._ledgers[stack.pop()]
            yield ledger
            stack.extend(ledger.children)

    # -- queries ------------------------------------------------------------------

    def chain(self, lineage: str) -> list[LedgerState]:
        """``lineage``'s ledger and every ancestor's, up to its durable root."""
        ledger = self.get(lineage)
        chain = [ledger]
        while ledger.parent is not None:
            ledger = self._ledgers[ledger.parent]
            chain.append(ledger)
        return chain

    def deadline(self, lineage: str) -> int | None:
        """The first instant at which ``lineage``'s lease, or an ancestor's, expires: a
        decision that relies on the lease being live must commit before it (None when
        nothing in the chain expires; 0 for a lease that has left the book: it ended
        before the journal's last commit, so nothing relying on it can commit)."""
        if lineage not in self._ledgers and self.retired(lineage):
            return 0
        ends = [x.expires_at_ms for x in self.chain(lineage) if x.expires_at_ms is not None]
        return min(ends, default=None)

    def charge(self, ledger: LedgerState, at_ms: int) -> Budget:
        """What a child costs its parent at ``at_ms``: all of a live lease, else only
        what its subtree spent."""
        return budget_of(
            formula.charge(
                vec_of(ledger.allocation), vec_of(ledger.subtree_spent), ledger.active(at_ms)
            )
        )

    def outstanding(self, lineage: str, at_ms: int) -> Budget:
        """The sum of the charges of ``lineage``'s children at ``at_ms``."""
        ledger = self.get(lineage)
        if at_ms >= ledger.horizon_ms:
            self._advance(ledger, at_ms)
            return budget_of(vec_add(ledger.live, ledger.ended))
        return self.outstanding_by_walk(lineage, at_ms)  # a time the sums have passed

    def outstanding_by_walk(self, lineage: str, at_ms: int) -> Budget:
        """:meth:`outstanding` computed child by child (exact for any time the children
        that left the book had ended by; before that, they count as live: slow)."""
        ledger = self.get(lineage)
        total = (
            ledger.retired_allocation if at_ms < ledger.retired_until_ms else ledger.retired_charge
        )
        for child in ledger.children:
            total = vec_add(total, vec_of(self.charge(self._ledgers[child], at_ms)))
        return budget_of(total)

    def unsettled(self, lineage: str, at_ms: int, settled_ms: int) -> bool:
        """Whether what ``lineage`` holds at ``at_ms`` counts a child as live only
        because it expired after ``settled_ms`` (a decision can settle the journal
        first: commit an entry, whose commit time floors every later one)."""
        ledger = self.get(lineage)
        if settled_ms >= at_ms or not ledger.active(at_ms):
            return False
        self.outstanding(lineage, at_ms)  # ends what expired by then
        return self._unsettled(ledger, settled_ms) != VEC_ZERO

    def settles_at(self, lineage: str, at_ms: int, settled_ms: int) -> int | None:
        """The settled time at which what ``lineage`` holds at ``at_ms`` no longer counts
        any child as live for want of it: the latest end among its children that
        expired after ``settled_ms`` (by ``at_ms``) and still hold budget back; None if
        there are none. A decision may take those ends as final if its own commit is
        stamped at or after it and nothing commits between its read and its commit
        (a head pin: docs/decisions-and-views.md)."""
        ledger = self.get(lineage)
        if settled_ms >= at_ms or not ledger.active(at_ms):
            return None
        self.outstanding(lineage, at_ms)  # ends what expired by then
        ends = [expires for expires, _ in self._held_back(ledger, settled_ms)]
        return max(ends, default=None)

    def remaining(self, lineage: str, at_ms: int, settled_ms: int | None = None) -> Budget:
        """What ``lineage`` can still spend or lease out at ``at_ms`` (zero once ended).

        With ``settled_ms`` (the commit time of the last entry the book has folded, for
        a decision about to be appended), children that expired after it count as live:
        a charge stamped before their end may not have been read yet (``_unsettled``)."""
        if lineage not in self._ledgers and self.retired(lineage):
            return Budget.zero()
        ledger = self.get(lineage)
        if not ledger.active(at_ms):
            return Budget.zero()
        outstanding = vec_of(self.outstanding(lineage, at_ms))
        if settled_ms is not None and settled_ms < at_ms:
            outstanding = vec_add(outstanding, self._unsettled(ledger, settled_ms))
        if ledger.held:
            outstanding = vec_add(outstanding, (ledger.held, 0, 0, 0, 0))
        return budget_of(
            formula.remaining(vec_of(ledger.allocation), vec_of(ledger.spent), outstanding, True)
        )

    def held(self, lineage: str, holds: Collection[str] = ()) -> int:
        """What ``lineage``'s ``holds`` (all of its holds, when none is named) still hold
        of its tokens: :meth:`remaining` counts it spent; a charge settled on them draws
        from it (0 for an ended lease that left the book)."""
        ledger = self._ledgers.get(lineage)
        if ledger is None:
            return 0
        if not holds:
            return ledger.held
        return sum(ledger.holds.get(hold, 0) for hold in set(holds))

    # -- decisions (pure: they return events, the caller appends) -----------------

    def decide_leases(
        self,
        parent: str,
        children: list[tuple[str, Budget, int, str]],
        at_ms: int,
        fanout: str | None = None,
        settled_ms: int | None = None,
    ) -> tuple[LeaseGranted, ...]:
        """Leases for ``(lineage, allocation, expires_at_ms, grant digest)`` children,
        or refuse.

        Every allocation together must fit in the parent's remaining budget, on every
        axis; a lease never outlives its parent's or an ancestor's (one that would is
        refused: its grant would say more than its lease), nor ends past
        :data:`MAX_EXPIRY_MS`. Children with equal terms share one event. The sums are
        taken on plain integers, so no total of allocations overflows a model.
        """
        ledger = self.get(parent)
        if not ledger.active(at_ms):
            raise LeaseEndedError(f"{shown(parent)}'s lease has ended; it cannot lease budget out")
        available = self.remaining(parent, at_ms, settled_ms)
        cap = self.deadline(parent)
        # Group children by (allocation, expiry): a fan-out's children share both. Keyed
        # by the budget object's identity first, since hashing a model is not free.
        groups: dict[tuple[int, int], tuple[Budget, list[str], list[str]]] = {}
        wanted = VEC_ZERO
        for lineage, allocation, until, digest in children:
            if cap is not None and until > cap:
                raise LeaseEndedError(
                    f"a lease until {until} ms would outlive {shown(parent)}'s, which ends "
                    f"at {cap} ms"
                )
            if not 0 <= until <= MAX_EXPIRY_MS:
                raise ExpiryOutOfRangeError(
                    f"a lease for {shown(lineage)} until {until} ms would end outside the "
                    f"dates Charter can show (0 to {MAX_EXPIRY_MS} ms, the end of year 9999)"
                )
            group = groups.get((id(allocation), until))
            if group is None:
                group = groups[id(allocation), until] = (allocation, [], [])
            group[1].append(lineage)
            group[2].append(digest)
        for allocation, members, _ in groups.values():
            wanted = vec_add(wanted, tuple(len(members) * x for x in vec_of(allocation)))  # type: ignore[arg-type]
        if not budget_of(wanted).fits_within(available):
            # On vectors: the total (and so the shortfall) may pass 2^63 − 1, which a
            # validated Budget refuses; budget_of only carries it to render().
            short = budget_of(vec_sat_sub(wanted, vec_of(available)))
            raise InsufficientBudgetError(
                f"{shown(parent)} holds {available.render()} but {len(children)} lease(s) "
                f"need {budget_of(wanted).render()} (short by {short.render()}); ask for less "
                "or wait for running leases to end"
            )
        return tuple(
            LeaseGranted(
                parent=parent,
                lineages=tuple(lineages),
                allocation=allocation,
                expires_at_ms=until,
                fanout=fanout,
                grants=tuple(digests),
            )
            for (_, until), (allocation, lineages, digests) in groups.items()
        )

    def decide_usage(
        self,
        lineage: str,
        amount: Budget,
        at_ms: int,
        settled_ms: int | None = None,
        *,
        available: Budget | None = None,
        holds: Collection[str] = (),
    ) -> UsageRecorded:
        """Charge ``amount``, clamped to what the lease still holds (``available``: its
        :meth:`remaining` at ``at_ms`` and ``settled_ms``, when the caller has it), and
        what its ``holds`` (the holds the charged calls were settled on) hold of it."""
        ledger = self.get(lineage)
        if not ledger.active(at_ms):
            raise LeaseEndedError(
                f"{shown(lineage)}'s lease has ended; record usage before releasing it"
            )
        if available is None:
            available = self.remaining(lineage, at_ms, settled_ms)
        if holds:
            held = self.held(lineage, holds)
            available = budget_of(vec_add(vec_of(available), (held, 0, 0, 0, 0)))
        # On vectors (every result is in range: a minimum and differences floored at 0).
        want, have = vec_of(amount), vec_of(available)
        charged = vec_min(want, have)
        allocation = vec_of(ledger.allocation)
        exhausted = want != charged or any(
            h - c == 0 and a > 0 for h, c, a in zip(have, charged, allocation, strict=True)
        )
        return UsageRecorded(
            lineage=lineage,
            amount=budget_of(charged),
            refused=budget_of(vec_sub(want, charged)),
            exhausted=exhausted,
        )

    def decide_release(self, lineage: str, at_ms: int) -> LeaseReleased:
        """End the lease now. It must be live, and (like usage) the release must commit
        before :meth:`deadline`: the caller passes that to the journal."""
        ledger = self.get(lineage)
        if ledger.parent is None:
            raise StateError(f"{shown(lineage)} is a durable agent's ledger, not a lease")
        if not ledger.active(at_ms):
            raise LeaseEndedError(f"{shown(lineage)}'s lease has already ended")
        return LeaseReleased(lineage=lineage)

    def decide_renewal(self, lineage: str, expires_at_ms: int, at_ms: int) -> LeaseRenewed:
        """Move the lease's end to ``expires_at_ms``: later than now, never past its
        parent's lease (or an ancestor's), nor its grant's expiry, nor
        :data:`MAX_EXPIRY_MS`. Each is refused by name; an expiry that is not an integer
        a journal can store is bad input."""
        if (
            not isinstance(expires_at_ms, int)
            or isinstance(expires_at_ms, bool)
            or not 0 <= expires_at_ms <= INT64_MAX
        ):
            raise BadInputError(
                f"a lease's new end must be a whole number of epoch milliseconds from 0 to "
                f"{INT64_MAX}, not {shown(repr(expires_at_ms))}"
            )
        ledger = self.get(lineage)
        name = shown(lineage)
        if ledger.parent is None:
            raise StateError(f"{name} is a durable agent's ledger, not a lease")
        if not ledger.active(at_ms):
            raise LeaseEndedError(f"{name}'s lease has ended; it cannot be renewed")
        parent = self.get(ledger.parent)
        if not parent.active(at_ms):
            raise LeaseEndedError(f"{shown(ledger.parent)}'s lease has ended; {name} cannot renew")
        if ledger.expires_at_ms is not None and expires_at_ms <= ledger.expires_at_ms:
            raise BadInputError(
                f"renewal of {name} to {expires_at_ms} ms does not extend it (it "
                f"expires at {ledger.expires_at_ms} ms)"
            )
        above = self.deadline(ledger.parent)  # the parent's, or an ancestor's if earlier
        if above is not None and expires_at_ms > above:
            raise RenewalBeyondParentError(
                f"{name} cannot be renewed to {expires_at_ms} ms: its parent "
                f"{shown(ledger.parent)} holds its budget only until {above} ms"
                if above == parent.expires_at_ms
                else f"{name} cannot be renewed to {expires_at_ms} ms: a lease above it, "
                f"which holds its budget, ends at {above} ms"
            )
        if ledger.grant_end_ms is not None and expires_at_ms > ledger.grant_end_ms:
            raise RenewalBeyondGrantError(
                f"{name} cannot be renewed to {expires_at_ms} ms: its grant expires at "
                f"{ledger.grant_end_ms} ms, and a lease never outlives its grant (spawn the "
                "work again under a new grant instead)"
            )
        if expires_at_ms > MAX_EXPIRY_MS:
            raise ExpiryOutOfRangeError(
                f"{name} cannot be renewed to {expires_at_ms} ms: a lease ends at the latest "
                f"at {MAX_EXPIRY_MS} ms (the end of year 9999), the last instant a date shows"
            )
        return LeaseRenewed(lineage=lineage, parent=ledger.parent, expires_at_ms=expires_at_ms)
