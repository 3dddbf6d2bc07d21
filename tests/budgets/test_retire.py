"""Ended leases leave the book (LeaseBook.retire) and nothing a decision sees changes:
a book that retires decides, on every interleaving, as the book that keeps every lease
does, refuses an ended lease by the same reason, and holds only the live leases."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from charter.budgets import (
    BudgetLedgerOpened,
    LeaseBook,
    LeaseEndedError,
    UnknownLeaseError,
    UsageRecorded,
)
from charter.control import BudgetService, ResourceView, register_root
from charter.core import Budget, CharterError, Event, KeyStore
from charter.core.budget import vec_of
from charter.ledger import Journal

from ._support import ceiling, intent, service
from .test_lease_properties import ALLOCATION, DIGEST, ROOT, _pick, _scaled, op

T0 = 1_800_000_000_000


class _Pair:
    """The book that keeps every lease (the oracle) and one that retires, fed the same
    committed events; the retiring one retires before each, as ResourceView does."""

    def __init__(self) -> None:
        self.kept, self.retiring = LeaseBook(), LeaseBook()
        self.retired: set[str] = set()
        self.apply(BudgetLedgerOpened(lineage=ROOT, allocation=ALLOCATION), T0)

    def apply(self, event: object, at_ms: int) -> None:
        self.retired.update(lineage for lineage, _ in self.retiring.retire(at_ms))
        self.kept.apply(event, at_ms)  # type: ignore[arg-type]
        self.retiring.apply(event, at_ms)  # type: ignore[arg-type]

    def decide(self, method: str, *args: object) -> list[object]:
        """``book.method(*args)`` on both: the same events, or the same refusal."""
        outcomes: list[object] = []
        for book in (self.kept, self.retiring):
            try:
                made = getattr(book, method)(*args)
                outcomes.append(list(made) if isinstance(made, tuple) else [made])
            except CharterError as error:
                outcomes.append(type(error))
        assert outcomes[0] == outcomes[1], outcomes
        return outcomes[0] if isinstance(outcomes[0], list) else []


def _same_answers(pair: _Pair, now: int) -> None:
    kept, retiring = pair.kept, pair.retiring
    for ledger in kept.ledgers():
        lineage = ledger.lineage
        if lineage in retiring:
            for at in (now, now + 30_000):
                assert retiring.remaining(lineage, at) == kept.remaining(lineage, at), lineage
                assert retiring.remaining(lineage, at, now) == kept.remaining(lineage, at, now)
                assert retiring.outstanding(lineage, at) == kept.outstanding(lineage, at)
            assert retiring.deadline(lineage) == kept.deadline(lineage)
            # Asked about a time before a retired child's end, the walk counts it as
            # live: never less than the book that kept it.
            earlier = now - 45_000
            walked = vec_of(retiring.outstanding_by_walk(lineage, earlier))
            exact = vec_of(kept.outstanding_by_walk(lineage, earlier))
            assert all(a >= b for a, b in zip(walked, exact, strict=True)), lineage
        else:
            assert lineage in pair.retired, lineage
            assert retiring.retired(lineage), lineage
            assert not ledger.active(now)  # only ended leases leave
            assert retiring.remaining(lineage, now) == kept.remaining(lineage, now) == Budget.zero()
            assert retiring.deadline(lineage) == 0
    assert {x.lineage for x in retiring.ledgers()} <= {x.lineage for x in kept.ledgers()}
    assert not retiring.retired(f"{ROOT}/sa-999999")  # never minted: not an ended lease


@settings(max_examples=1000, deadline=None)
@given(st.lists(op, min_size=1, max_size=60))
def test_a_book_that_retires_decides_as_the_book_that_keeps_every_lease(
    ops: list[tuple],  # type: ignore[type-arg]
) -> None:
    pair = _Pair()
    now, spawned = T0, 0
    for kind, *args in ops:
        # Targets are picked among every lease ever granted: ended ones are refused by
        # both books, by the same reason, whether or not they left the retiring one.
        match kind:
            case "spawn":
                index, width, share, ttl = args
                parent = _pick(pair.kept, index).lineage
                each = _scaled(pair.kept.remaining(parent, now), share // width)
                children = []
                for _ in range(width):
                    spawned += 1
                    children.append((f"{parent}/sa-{spawned}", each, now + 1_000 * ttl + 1, DIGEST))
                made = pair.decide("decide_leases", parent, children, now)
            case "usage":
                index, share = args
                ledger = _pick(pair.kept, index)
                amount = _scaled(ledger.allocation, share)
                made = pair.decide("decide_usage", ledger.lineage, amount, now)
            case "release":
                (index,) = args
                lineage = _pick(pair.kept, index).lineage
                made = pair.decide("decide_release", lineage, now)
            case "renew":
                index, extra = args
                ledger = _pick(pair.kept, index)
                until = (ledger.expires_at_ms or now) + extra
                made = pair.decide("decide_renewal", ledger.lineage, until, now)
            case _:
                (step,) = args
                now += step
                made = []
        for event in made:
            pair.apply(event, now)
        _same_answers(pair, now)


def _history(count: int, width: int) -> list[tuple[Event, int]]:
    """The root's ledger, then ``count`` fan-outs of ``width`` one-second leases, each
    committed after the previous one's leases expired: ``(event, commit time)``."""
    book = LeaseBook()
    opened = BudgetLedgerOpened(lineage=ROOT, allocation=ALLOCATION)
    book.apply(opened, T0)
    history: list[tuple[Event, int]] = [(opened, T0)]
    lease = Budget.parse("tokens=1,wall=1s,cpu=1s,mem=0,egress=0")
    now = T0
    for n in range(count):
        now += 2_000
        children = [
            (f"{ROOT}/sa-{n * width + i + 1}", lease, now + 1_000, DIGEST) for i in range(width)
        ]
        for event in book.decide_leases(ROOT, children, now):
            book.apply(event, now)
            history.append((event, now))
    return history


def test_the_book_holds_the_live_leases_not_the_history() -> None:
    """After 20 or 2,000 fan-outs whose leases ended, a view folded from the journal
    (as a fresh process folds it, no decision in between) holds the same state: the
    root and the last fan-out's live leases, and answers as the book that keeps every
    lease. That book, the control, holds all of them."""
    sizes = []
    for count in (20, 2_000):
        history = _history(count, width=5)
        view, kept = ResourceView(), LeaseBook()
        for event, at in history:
            view.apply(event, 0, at)
            kept.apply(event, at)
        now = history[-1][1]
        for at in (now, now + 1_000):  # the last fan-out's leases live, then ended
            assert view.book.remaining(ROOT, at) == kept.remaining(ROOT, at)
        assert kept.remaining(ROOT, now) != ALLOCATION
        assert view.population.live(now) == 5
        population = view.population
        root = view.book.get(ROOT)
        sizes.append(
            (
                sum(1 for _ in view.book.ledgers()),
                len(root.children),
                len(root.expiries),
                len(root.retired),
                len(population._released) + len(population._children) + len(population._open),
                len(population._expiries),
                len(view.book._ends),
            )
        )
        assert view.book.retired(f"{ROOT}/sa-1")
        assert not view.book.retired(f"{ROOT}/sa-{count * 5 + 1}")
    assert sizes[0] == sizes[1], sizes
    assert sizes[0][0] == 6, sizes  # the root and five live leases
    assert sum(1 for _ in kept.ledgers()) == 1 + 2_000 * 5  # the control


def test_a_usage_under_a_retired_lease_is_charged_to_its_ancestor_in_full() -> None:
    """Only a journal that broke the deadline holds one: it is charged, unclamped, to
    the nearest ancestor still in the book, so the root never holds more than the book
    that kept the lease would give it."""
    view = ResourceView()
    history = _history(2, width=1)
    for event, at in history:
        view.apply(event, 0, at)
    now = history[-1][1]
    late = UsageRecorded(
        lineage=f"{ROOT}/sa-1",
        amount=_scaled(ALLOCATION, 1),
        refused=Budget.zero(),
        exhausted=False,
    )
    before = view.book.remaining(ROOT, now + 5_000)
    view.apply(late, 0, now + 5_000)
    after = view.book.remaining(ROOT, now + 5_000)
    assert before.saturating_sub(after) == _scaled(ALLOCATION, 1)
    assert view.book.get(ROOT).subtree_spent == _scaled(ALLOCATION, 1)


def test_a_lease_that_left_the_book_is_refused_as_ended_and_journaled(
    journal_url: str, tmp_path: Path
) -> None:
    """On a real journal: a released lease leaves the views at the next entry; a usage
    of it, and a fan-out by it, are refused as ``lease-ended`` and journaled, as before
    it left. The control: a lineage never leased is a typo, refused unjournaled."""
    keys = KeyStore(tmp_path / "home")
    journal = Journal.create(journal_url)
    register_root(journal, keys, "root", ceiling())
    svc = service(journal, keys)
    root = svc.durable_caller("root")
    cost = Budget.parse("tokens=1k,wall=1m,cpu=1m,mem=1MiB,egress=0")
    minted = svc.spawn(root, intent(1, cost)).children[0]
    child = str(minted.lineage)
    budgets = BudgetService(journal, shared=svc.views)
    budgets.release(child)
    svc.spawn(root, intent(1, cost))  # one more entry: the released lease leaves
    assert child not in svc.resources.book
    assert svc.resources.book.retired(child)
    head = journal.head()
    assert head is not None
    with pytest.raises(LeaseEndedError):
        budgets.record_usage(child, cost)
    (refused,) = [e.event for e in journal.entries(head[0] + 1, types=("BudgetRefused",))]
    assert refused.reason == "lease-ended"  # type: ignore[attr-defined]
    head = journal.head()
    assert head is not None
    small = Budget.parse("tokens=1,wall=1s,cpu=1s,mem=0,egress=0")
    with pytest.raises(LeaseEndedError):
        svc.spawn(root.child(minted), intent(1, small))
    after = journal.head()
    assert after is not None
    journaled = [e.event for e in journal.entries(head[0] + 1)]
    # The gate's decision, then the fan-out's refusal by its reason.
    assert [getattr(e, "reason", None) for e in journaled][-1] == "lease-ended", journaled
    with pytest.raises(UnknownLeaseError):  # the control
        budgets.record_usage("agent:root/sa-999", cost)
    assert journal.head() == after
    journal.close()
