"""Property: no interleaving of spawns, usage, releases, renewals and expiries ever lets
a node's outstanding leases plus its own spend exceed its allocation, or a subtree
exceed the root."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from charter.budgets import BudgetLedgerOpened, LeaseBook, LedgerState
from charter.core import Budget, CharterError

ROOT = "agent:root"
ALLOCATION = Budget(
    tokens=1_000_000, wall_ms=3_600_000, cpu_ms=600_000, mem_bytes=2**32, egress_bytes=10**8
)

fraction = st.integers(min_value=0, max_value=150)
op = st.one_of(
    # a fan-out asks for up to twice what its parent holds: the book must refuse it
    st.tuples(
        st.just("spawn"), st.integers(0, 50), st.integers(1, 4), st.integers(0, 200), fraction
    ),
    st.tuples(st.just("usage"), st.integers(0, 50), fraction),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("renew"), st.integers(0, 50), st.integers(1, 120_000)),
    st.tuples(st.just("advance"), st.integers(1, 90_000)),
)


def _scaled(budget: Budget, percent: int) -> Budget:
    return Budget(**{a: getattr(budget, a) * percent // 100 for a in Budget.AXES})


def _check(book: LeaseBook, at_ms: int) -> None:
    root = book.get(ROOT)
    everything = Budget.zero()
    for ledger in book.ledgers():
        everything = everything + ledger.spent
        # the running sums agree with a walk over every child, at this time and earlier
        fast = book.outstanding(ledger.lineage, at_ms)
        assert fast == book.outstanding_by_walk(ledger.lineage, at_ms), ledger.lineage
        earlier = at_ms - 45_000
        assert book.outstanding(ledger.lineage, earlier) == book.outstanding_by_walk(
            ledger.lineage, earlier
        )
        if ledger.active(at_ms):
            used = ledger.spent + fast
            assert used.fits_within(ledger.allocation), (ledger.lineage, used, ledger.allocation)
        assert ledger.subtree_spent.fits_within(ledger.allocation), ledger.lineage
    assert everything.fits_within(root.allocation)  # no subtree ever exceeds the root
    assert root.subtree_spent == everything


def _pick(book: LeaseBook, index: int) -> LedgerState:
    ledgers = list(book.ledgers())
    return ledgers[index % len(ledgers)]


@settings(max_examples=1500, deadline=None)
@given(st.lists(op, min_size=1, max_size=60))
def test_no_interleaving_overspends(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    book = LeaseBook()
    now = 1_800_000_000_000
    book.apply(BudgetLedgerOpened(lineage=ROOT, allocation=ALLOCATION), now)
    spawned = 0
    for kind, *args in ops:
        try:
            match kind:
                case "spawn":
                    index, width, share, ttl = args
                    parent = _pick(book, index)
                    each = _scaled(book.remaining(parent.lineage, now), share // width)
                    children = []
                    for _ in range(width):
                        spawned += 1
                        lineage = f"{parent.lineage}/sa-{spawned}"
                        children.append((lineage, each, now + 1_000 * ttl + 1, DIGEST))
                    for event in book.decide_leases(parent.lineage, children, now):
                        book.apply(event, now)
                case "usage":
                    index, share = args
                    ledger = _pick(book, index)
                    amount = _scaled(ledger.allocation, share)
                    book.apply(book.decide_usage(ledger.lineage, amount, now), now)
                case "release":
                    (index,) = args
                    ledger = _pick(book, index)
                    book.apply(book.decide_release(ledger.lineage, now), now)
                case "renew":
                    index, extra = args
                    ledger = _pick(book, index)
                    until = (ledger.expires_at_ms or now) + extra
                    book.apply(book.decide_renewal(ledger.lineage, until, now), now)
                case "advance":
                    (step,) = args
                    now += step
        except CharterError:
            pass  # a refused operation changes nothing
        _check(book, now)


DIGEST = "00" * 32  # the lease book carries each child's grant digest, unread


def test_expiry_returns_unspent_budget_without_any_event() -> None:
    book = LeaseBook()
    t0 = 1_800_000_000_000
    book.apply(BudgetLedgerOpened(lineage=ROOT, allocation=ALLOCATION), t0)
    lease = _scaled(ALLOCATION, 50)
    for event in book.decide_leases(ROOT, [(f"{ROOT}/sa-1", lease, t0 + 10_000, DIGEST)], t0):
        book.apply(event, t0)
    spent = _scaled(lease, 20)
    book.apply(book.decide_usage(f"{ROOT}/sa-1", spent, t0 + 1), t0 + 1)
    assert book.remaining(ROOT, t0 + 9_999) == ALLOCATION.saturating_sub(lease)
    # One millisecond later, with no event at all, only what was spent stays charged.
    assert book.remaining(ROOT, t0 + 10_000) == ALLOCATION.saturating_sub(spent)
