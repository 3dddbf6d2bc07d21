"""Lease refusals and boundaries as direct tests (issue 14): until now they were reached
only inside random histories that swallow every error.

Each refusal is shown with its named error and ``reason`` beside the same request a
moment earlier (or a unit smaller) that is granted. Times are explicit: a lease is live
at ``t < expires_at_ms`` and has ended at ``t == expires_at_ms``.
"""

from __future__ import annotations

import pytest

from charter.budgets import (
    MAX_EXPIRY_MS,
    BudgetLedgerOpened,
    LeaseBook,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    UsageRecorded,
    errors,
    formula,
)
from charter.core import BadInputError, Budget, StateError

ROOT = "agent:root"
CHILD = f"{ROOT}/sa-1"
GRANDCHILD = f"{CHILD}/sa-1"
T0 = 1_800_000_000_000
ALLOCATION = Budget(tokens=1000, wall_ms=100_000, cpu_ms=10_000, mem_bytes=4096, egress_bytes=500)
LEASE = Budget(tokens=400, wall_ms=40_000, cpu_ms=4_000, mem_bytes=1024, egress_bytes=200)
SMALL = Budget(tokens=100, wall_ms=10_000, cpu_ms=1_000, mem_bytes=256, egress_bytes=50)
DIGEST = "00" * 32
NO_GRANT = ""  # a lease decided outside a spawn names no grant
CHILD_ENDS = T0 + 10_000
GRANDCHILD_ENDS = T0 + 5_000


def _apply(book: LeaseBook, events: object, at_ms: int) -> None:
    for event in events if isinstance(events, tuple) else (events,):
        book.apply(event, at_ms)


def _book(*, grandchild: bool = False, digest: str = NO_GRANT) -> LeaseBook:
    """A root ledger with one child lease (and optionally a grandchild under it). The
    leases name no grant unless ``digest`` is given: a renewal is then bounded by the
    parents alone (the grant's own bound has its tests below)."""
    book = LeaseBook()
    book.apply(BudgetLedgerOpened(lineage=ROOT, allocation=ALLOCATION), T0)
    _apply(book, book.decide_leases(ROOT, [(CHILD, LEASE, CHILD_ENDS, digest)], T0), T0)
    if grandchild:
        leases = book.decide_leases(CHILD, [(GRANDCHILD, SMALL, GRANDCHILD_ENDS, digest)], T0)
        _apply(book, leases, T0)
    return book


# -- a lease never outlives its parent's -------------------------------------------------


def test_a_lease_may_end_with_its_parent_but_never_after_it() -> None:
    book = _book()
    (granted,) = book.decide_leases(CHILD, [(GRANDCHILD, SMALL, CHILD_ENDS, DIGEST)], T0)
    assert granted.expires_at_ms == CHILD_ENDS
    with pytest.raises(errors.LeaseEndedError, match="outlive") as caught:
        book.decide_leases(CHILD, [(GRANDCHILD, SMALL, CHILD_ENDS + 1, DIGEST)], T0)
    assert caught.value.reason == "lease-ended"
    # One child of a fan-out that would outlive the parent refuses the whole fan-out.
    with pytest.raises(errors.LeaseEndedError):
        book.decide_leases(
            CHILD,
            [
                (f"{CHILD}/sa-1", SMALL, T0 + 1, DIGEST),
                (f"{CHILD}/sa-2", SMALL, T0 + 10**9, DIGEST),
            ],
            T0,
        )
    # A durable agent's ledger has no end: any expiry that renders fits under it.
    assert book.decide_leases(ROOT, [(f"{ROOT}/sa-9", SMALL, MAX_EXPIRY_MS, DIGEST)], T0)


def test_a_renewal_may_reach_its_parents_end_but_not_pass_it() -> None:
    book = _book(grandchild=True)
    renewed = book.decide_renewal(GRANDCHILD, CHILD_ENDS, T0 + 1)
    assert renewed == LeaseRenewed(lineage=GRANDCHILD, parent=CHILD, expires_at_ms=CHILD_ENDS)
    with pytest.raises(errors.RenewalBeyondParentError) as caught:
        book.decide_renewal(GRANDCHILD, CHILD_ENDS + 1, T0 + 1)
    assert caught.value.reason == "renewal-beyond-parent"
    # A child of a durable agent may be renewed as far as a date renders.
    assert book.decide_renewal(CHILD, MAX_EXPIRY_MS, T0 + 1).expires_at_ms == MAX_EXPIRY_MS


def test_the_deadline_of_a_decision_is_the_first_end_in_its_chain() -> None:
    book = _book(grandchild=True)
    assert book.deadline(GRANDCHILD) == GRANDCHILD_ENDS
    assert book.deadline(CHILD) == CHILD_ENDS
    assert book.deadline(ROOT) is None
    book.apply(book.decide_renewal(GRANDCHILD, CHILD_ENDS, T0 + 1), T0 + 1)
    assert book.deadline(GRANDCHILD) == CHILD_ENDS
    assert [x.lineage for x in book.chain(GRANDCHILD)] == [GRANDCHILD, CHILD, ROOT]


# -- renewals refused ---------------------------------------------------------------


def test_an_expired_lease_cannot_be_renewed() -> None:
    book = _book()
    assert book.decide_renewal(CHILD, CHILD_ENDS + 5, CHILD_ENDS - 1)  # a moment before
    with pytest.raises(errors.LeaseEndedError, match="cannot be renewed"):
        book.decide_renewal(CHILD, CHILD_ENDS + 5, CHILD_ENDS)


def test_a_lease_cannot_be_renewed_after_its_parents_lease_ended() -> None:
    book = _book(grandchild=True)
    # The grandchild renewed to its parent's end is live to the last instant before it ...
    book.apply(book.decide_renewal(GRANDCHILD, CHILD_ENDS, T0 + 1), T0 + 1)
    assert book.get(GRANDCHILD).active(CHILD_ENDS - 1)
    # ... and the parent's lease ending (released here) ends any further renewal.
    book.apply(book.decide_release(CHILD, T0 + 2), T0 + 2)
    with pytest.raises(errors.LeaseEndedError):
        book.decide_renewal(GRANDCHILD, CHILD_ENDS, T0 + 3)
    # A grandchild whose lease (folded from a journal, not decided here) outlives its
    # parent's: past the parent's end, the parent check refuses its renewal.
    book2 = _book()
    late = LeaseGranted(
        parent=CHILD, lineages=(GRANDCHILD,), allocation=SMALL, expires_at_ms=CHILD_ENDS + 500
    )
    book2.apply(late, T0)
    assert book2.get(GRANDCHILD).active(CHILD_ENDS)
    with pytest.raises(errors.LeaseEndedError, match="cannot renew"):
        book2.decide_renewal(GRANDCHILD, CHILD_ENDS + 501, CHILD_ENDS)
    # A moment earlier the parent is live, and the renewal is refused for its length.
    with pytest.raises(errors.RenewalBeyondParentError):
        book2.decide_renewal(GRANDCHILD, CHILD_ENDS + 501, CHILD_ENDS - 1)


def test_a_renewal_must_extend_the_lease() -> None:
    book = _book()
    with pytest.raises(BadInputError, match="does not extend"):
        book.decide_renewal(CHILD, CHILD_ENDS, T0)
    assert book.decide_renewal(CHILD, CHILD_ENDS + 1, T0).expires_at_ms == CHILD_ENDS + 1


def test_a_durable_ledger_is_not_a_lease() -> None:
    book = _book()
    with pytest.raises(StateError, match="not a lease"):
        book.decide_renewal(ROOT, T0 + 1, T0)
    with pytest.raises(StateError, match="not a lease"):
        book.decide_release(ROOT, T0)


# -- releases refused ---------------------------------------------------------------


def test_a_lease_released_twice_is_refused_the_second_time() -> None:
    book = _book(grandchild=True)
    released = book.decide_release(CHILD, T0 + 1)
    assert released == LeaseReleased(lineage=CHILD)
    book.apply(released, T0 + 1)
    with pytest.raises(errors.LeaseEndedError, match="already ended"):
        book.decide_release(CHILD, T0 + 1)
    # Releasing a lease ends its whole subtree at that instant.
    assert book.get(GRANDCHILD).released_at_ms == T0 + 1
    with pytest.raises(errors.LeaseEndedError):
        book.decide_release(GRANDCHILD, T0 + 2)
    assert book.decide_release(f"{CHILD}", T0) is not None  # before the release: live


def test_a_lease_cannot_be_released_at_or_after_its_expiry() -> None:
    book = _book()
    assert book.decide_release(CHILD, CHILD_ENDS - 1) == LeaseReleased(lineage=CHILD)
    with pytest.raises(errors.LeaseEndedError):
        book.decide_release(CHILD, CHILD_ENDS)


# -- the exact expiry instant ---------------------------------------------------------


def test_a_lease_ends_exactly_at_its_expiry_instant() -> None:
    book = _book()
    child = book.get(CHILD)
    assert child.active(CHILD_ENDS - 1)
    assert not child.active(CHILD_ENDS)
    assert book.remaining(CHILD, CHILD_ENDS - 1) == LEASE
    assert book.remaining(CHILD, CHILD_ENDS) == Budget.zero()
    assert book.remaining(ROOT, CHILD_ENDS - 1) == ALLOCATION.saturating_sub(LEASE)
    assert book.remaining(ROOT, CHILD_ENDS) == ALLOCATION
    usage = book.decide_usage(CHILD, SMALL, CHILD_ENDS - 1)
    assert (usage.amount, usage.refused, usage.exhausted) == (SMALL, Budget.zero(), False)
    with pytest.raises(errors.LeaseEndedError, match="record usage before"):
        book.decide_usage(CHILD, SMALL, CHILD_ENDS)
    with pytest.raises(errors.LeaseEndedError, match="cannot lease budget out"):
        book.decide_leases(CHILD, [(GRANDCHILD, SMALL, CHILD_ENDS, DIGEST)], CHILD_ENDS)
    # The status names why a lease is not live.
    assert formula.status(None, CHILD_ENDS, CHILD_ENDS - 1) == "active"
    assert formula.status(None, CHILD_ENDS, CHILD_ENDS) == "expired"
    assert formula.status(T0, CHILD_ENDS, T0) == "released"
    assert formula.status(T0, CHILD_ENDS, T0 - 1) == "active"
    assert formula.status(CHILD_ENDS + 1, CHILD_ENDS, CHILD_ENDS) == "expired"
    assert formula.status(None, None, 2**62) == "active"


# -- budget refusals and boundaries --------------------------------------------------


def test_leases_that_fit_exactly_are_granted_and_one_unit_more_is_refused() -> None:
    book = _book()
    left = ALLOCATION.saturating_sub(LEASE)
    half = left.split(2)
    rest = left.saturating_sub(half)
    granted = book.decide_leases(
        ROOT, [(f"{ROOT}/sa-2", half, T0 + 1, DIGEST), (f"{ROOT}/sa-3", rest, T0 + 1, DIGEST)], T0
    )
    assert sum(len(g.lineages) for g in granted) == 2
    for axis in Budget.AXES:
        over = rest.model_copy(update={axis: getattr(rest, axis) + 1})
        with pytest.raises(errors.InsufficientBudgetError, match="short by") as caught:
            book.decide_leases(
                ROOT,
                [(f"{ROOT}/sa-2", half, T0 + 1, DIGEST), (f"{ROOT}/sa-3", over, T0 + 1, DIGEST)],
                T0,
            )
        assert caught.value.reason == "insufficient-budget"
        assert f"{axis.split('_')[0]}=1" in str(caught.value).split("short by")[1]


def test_children_with_equal_terms_share_one_event_and_count_each() -> None:
    book = _book()
    share = SMALL
    kids = [(f"{ROOT}/sa-{i}", share, T0 + 50, f"{i:064x}") for i in range(2, 5)]
    other = [(f"{ROOT}/sa-9", share, T0 + 60, "ff" * 32)]
    events = book.decide_leases(ROOT, kids + other, T0, fanout="f1")
    assert [(e.lineages, e.expires_at_ms, e.grants, e.fanout) for e in events] == [
        (tuple(k[0] for k in kids), T0 + 50, tuple(k[3] for k in kids), "f1"),
        (("agent:root/sa-9",), T0 + 60, ("ff" * 32,), "f1"),
    ]
    _apply(book, events, T0)
    four = share + share + share + share
    assert book.remaining(ROOT, T0) == ALLOCATION.saturating_sub(LEASE).saturating_sub(four)
    assert book.outstanding(ROOT, T0) == LEASE + four
    # Three of them expire at T0 + 50; the fourth still holds its lease.
    assert book.outstanding(ROOT, T0 + 50) == LEASE + share
    assert book.outstanding_by_walk(ROOT, T0 + 50) == LEASE + share
    # Asking for four when three fit is refused as a whole.
    with pytest.raises(errors.InsufficientBudgetError):
        book.decide_leases(ROOT, [(f"{ROOT}/x{i}", LEASE, T0 + 1, DIGEST) for i in range(2)], T0)


def test_a_lease_event_names_one_digest_per_child_or_none() -> None:
    LeaseGranted(parent=ROOT, lineages=(CHILD,), allocation=SMALL, expires_at_ms=1)
    LeaseGranted(parent=ROOT, lineages=(CHILD,), allocation=SMALL, expires_at_ms=1, grants=("a",))
    with pytest.raises(ValueError, match="one grant digest per child"):
        LeaseGranted(
            parent=ROOT, lineages=(CHILD,), allocation=SMALL, expires_at_ms=1, grants=("a", "b")
        )


def test_usage_is_clamped_to_what_the_lease_holds() -> None:
    book = _book()
    whole = book.decide_usage(CHILD, LEASE, T0 + 1)
    assert (whole.amount, whole.refused, whole.exhausted) == (LEASE, Budget.zero(), True)
    more = LEASE + SMALL
    over = book.decide_usage(CHILD, more, T0 + 1)
    assert (over.amount, over.refused, over.exhausted) == (LEASE, SMALL, True)
    one_axis = Budget(tokens=400, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)
    drained = book.decide_usage(CHILD, one_axis, T0 + 1)
    assert (drained.amount, drained.exhausted) == (one_axis, True)
    less = Budget(tokens=399, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)
    assert not book.decide_usage(CHILD, less, T0 + 1).exhausted
    book.apply(book.decide_usage(CHILD, SMALL, T0 + 1), T0 + 1)
    assert book.remaining(CHILD, T0 + 2) == LEASE.saturating_sub(SMALL)
    assert book.get(CHILD).spent == SMALL
    assert book.get(ROOT).subtree_spent == SMALL
    # An axis the lease holds none of is never "exhausted" by reaching zero.
    zero_egress = SMALL.model_copy(update={"egress_bytes": 0})
    book.apply(
        LeaseGranted(
            parent=ROOT, lineages=("agent:root/z",), allocation=zero_egress, expires_at_ms=T0 + 9
        ),
        T0,
    )
    tiny = Budget(tokens=1, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)
    assert not book.decide_usage("agent:root/z", tiny, T0 + 1).exhausted
    flagged = UsageRecorded(lineage="agent:root/z", amount=tiny, refused=tiny, exhausted=True)
    book.apply(flagged, T0 + 1)
    assert book.get("agent:root/z").exhausted
    book.apply(
        UsageRecorded(lineage="agent:root/z", amount=tiny, refused=tiny, exhausted=False), T0 + 1
    )
    assert book.get("agent:root/z").exhausted  # once exhausted, it stays so


def test_an_ended_lease_returns_all_but_what_its_subtree_spent() -> None:
    book = _book(grandchild=True)
    spend = Budget(tokens=10, wall_ms=10, cpu_ms=10, mem_bytes=10, egress_bytes=10)
    book.apply(book.decide_usage(GRANDCHILD, spend, T0 + 1), T0 + 1)
    book.apply(book.decide_usage(CHILD, spend, T0 + 1), T0 + 1)
    assert book.get(CHILD).subtree_spent == spend + spend
    assert book.remaining(ROOT, T0 + 2) == ALLOCATION.saturating_sub(LEASE)
    book.apply(book.decide_release(CHILD, T0 + 3), T0 + 3)
    assert book.remaining(ROOT, T0 + 3) == ALLOCATION.saturating_sub(spend + spend)
    assert book.remaining(ROOT, T0 + 2) == ALLOCATION.saturating_sub(LEASE)  # as of before
    assert book.charge(book.get(CHILD), T0 + 3) == spend + spend
    assert book.charge(book.get(CHILD), T0 + 2) == LEASE
    # Usage recorded after the end (as a late event) still follows its subtree's charge.
    book.apply(
        UsageRecorded(lineage=GRANDCHILD, amount=spend, refused=Budget.zero(), exhausted=False),
        T0 + 4,
    )
    assert book.remaining(ROOT, T0 + 4) == ALLOCATION.saturating_sub(spend + spend + spend)


def test_a_lease_renewed_after_its_expiry_was_passed_is_live_again() -> None:
    """The fold's running sums had moved it to "ended"; a renewal moves it back."""
    book = _book()
    assert book.remaining(ROOT, CHILD_ENDS) == ALLOCATION  # the sums pass its expiry
    book.apply(
        LeaseRenewed(lineage=CHILD, parent=ROOT, expires_at_ms=CHILD_ENDS + 100), CHILD_ENDS - 1
    )
    assert book.remaining(ROOT, CHILD_ENDS + 50) == ALLOCATION.saturating_sub(LEASE)
    assert book.outstanding(ROOT, CHILD_ENDS + 50) == book.outstanding_by_walk(
        ROOT, CHILD_ENDS + 50
    )
    assert book.remaining(ROOT, CHILD_ENDS + 100) == ALLOCATION


def test_no_ledger_is_a_named_refusal() -> None:
    book = _book()
    assert CHILD in book
    assert "agent:nobody" not in book
    for call in (
        lambda: book.get("agent:nobody"),
        lambda: book.remaining("agent:nobody", T0),
        lambda: book.decide_usage("agent:nobody", SMALL, T0),
        lambda: book.decide_leases("agent:nobody", [], T0),
    ):
        with pytest.raises(errors.NoBudgetLedgerError) as caught:
            call()
        assert caught.value.reason == "no-budget-ledger"


def test_the_formula_at_its_boundaries() -> None:
    a, s, o = (10, 10, 10, 10, 10), (3, 0, 10, 4, 0), (4, 11, 0, 6, 0)
    assert formula.remaining(a, s, o, True) == (3, 0, 0, 0, 10)
    assert formula.remaining(a, s, o, False) == (0, 0, 0, 0, 0)
    assert formula.charge(a, (3, 20, 10, 0, 11), True) == a
    assert formula.charge(a, (3, 20, 10, 0, 11), False) == (3, 10, 10, 0, 10)
    assert formula.is_active(None, 5, 4)
    assert not formula.is_active(None, 5, 5)
    assert not formula.is_active(4, 5, 4)
    assert formula.is_active(4, 5, 3)
    assert formula.is_active(None, None, 0)
    assert not formula.is_active(0, None, 0)


def test_the_book_lists_every_ledger() -> None:
    book = _book(grandchild=True)
    assert [x.lineage for x in book.ledgers()] == [ROOT, CHILD, GRANDCHILD]


def test_renewing_a_live_lease_does_not_count_it_twice() -> None:
    book = _book()
    book.apply(book.decide_renewal(CHILD, CHILD_ENDS + 1_000, T0 + 1), T0 + 1)
    assert book.outstanding(ROOT, T0 + 2) == LEASE
    # At the old expiry the lease is still live (the heap's stale entry is skipped) ...
    assert book.outstanding(ROOT, CHILD_ENDS) == LEASE
    assert book.outstanding_by_walk(ROOT, CHILD_ENDS) == LEASE
    # ... and it ends at the new one.
    assert book.outstanding(ROOT, CHILD_ENDS + 1_000) == Budget.zero()


def test_releasing_a_lease_whose_child_had_expired_ends_it_once() -> None:
    book = _book(grandchild=True)
    spend = Budget(tokens=1, wall_ms=1, cpu_ms=1, mem_bytes=1, egress_bytes=1)
    book.apply(book.decide_usage(GRANDCHILD, spend, T0 + 1), T0 + 1)
    # The child's sums pass the grandchild's expiry ...
    assert book.outstanding(CHILD, GRANDCHILD_ENDS) == spend
    # ... then the child is released, its whole subtree with it.
    book.apply(book.decide_release(CHILD, GRANDCHILD_ENDS + 1), GRANDCHILD_ENDS + 1)
    for at in (GRANDCHILD_ENDS + 1, GRANDCHILD_ENDS + 2):
        assert book.outstanding(CHILD, at) == spend
        assert book.outstanding(CHILD, at) == book.outstanding_by_walk(CHILD, at)
        assert book.outstanding(ROOT, at) == spend
    assert book.remaining(ROOT, GRANDCHILD_ENDS + 2) == ALLOCATION.saturating_sub(spend)


def test_an_axis_holding_exactly_one_unit_is_exhausted_when_spent() -> None:
    book = _book()
    one = Budget(tokens=1, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)
    events = book.decide_leases(CHILD, [(GRANDCHILD, one, T0 + 5, DIGEST)], T0)
    _apply(book, events, T0)
    assert book.decide_usage(GRANDCHILD, one, T0 + 1).exhausted
    assert not book.decide_usage(GRANDCHILD, Budget.zero(), T0 + 1).exhausted


def test_lease_events_are_frozen() -> None:
    from pydantic import ValidationError

    event = LeaseGranted(parent=ROOT, lineages=(CHILD,), allocation=SMALL, expires_at_ms=1)
    with pytest.raises(ValidationError, match="frozen"):
        event.expires_at_ms = 2**62  # type: ignore[misc]
    assert event.expires_at_ms == 1
    with pytest.raises(ValidationError, match="Extra inputs"):
        LeaseReleased(lineage=CHILD, parent=ROOT)  # type: ignore[call-arg]
