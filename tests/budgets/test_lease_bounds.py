"""Leases never outlive their grants, their parents or the dates Charter can show, and a
release commits before the lease's end like usage does (issue 21, points 3 and 4).

Each attack is beside its positive control: the same request a unit smaller, or on a
lease without the bound, that is granted. Journal tests run on SQLite and PostgreSQL;
time is injected (the service's decision clock), never slept.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from charter.budgets import (
    MAX_EXPIRY_MS,
    BudgetLedgerOpened,
    BudgetRefused,
    ExpiryOutOfRangeError,
    LeaseBook,
    LeaseEndedError,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    RenewalBeyondGrantError,
    RenewalBeyondParentError,
    render_instant,
)
from charter.control import BudgetService
from charter.core import BadInputError, Budget, CharterError, KeyStore, now_ms
from charter.core.budget import INT64_MAX
from charter.ledger import Journal
from tests.journal.test_cli import charter

from ._support import ceiling, intent, register_root, service

ROOT = "agent:root"
ONE = Budget(tokens=10, wall_ms=10, cpu_ms=10, mem_bytes=10, egress_bytes=10)
BIG = Budget(tokens=10**6, wall_ms=10**9, cpu_ms=10**9, mem_bytes=10**9, egress_bytes=10**9)
DIGEST = "ab" * 32
T0 = 1_800_000_000_000


def _refusals(journal: Journal, operation: str) -> list[BudgetRefused]:
    found = [e.event for e in journal.entries(types=("BudgetRefused",))]
    return [e for e in found if isinstance(e, BudgetRefused) and e.operation == operation]


def _lease(journal: Journal, lineage: str, until: int, *, grant: bool, parent: str = ROOT) -> None:
    """A lease appended as the journal would hold it (naming its grant, or none)."""
    journal.append(
        [
            LeaseGranted(
                parent=parent,
                lineages=(lineage,),
                allocation=ONE,
                expires_at_ms=until,
                grants=(DIGEST,) if grant else (),
            )
        ]
    )


def _root(journal: Journal) -> None:
    journal.append([BudgetLedgerOpened(lineage=ROOT, allocation=BIG)])


# -- a lease never outlives its grant ----------------------------------------------------


def test_a_renewal_past_the_grant_is_refused_in_the_book() -> None:
    book = LeaseBook()
    book.apply(BudgetLedgerOpened(lineage=ROOT, allocation=BIG), T0)
    for lineage, digest in ((f"{ROOT}/sa-1", DIGEST), (f"{ROOT}/sa-2", "")):
        for event in book.decide_leases(ROOT, [(lineage, ONE, T0 + 100, digest)], T0):
            book.apply(event, T0)
    assert book.get(f"{ROOT}/sa-1").grant_end_ms == T0 + 100
    with pytest.raises(RenewalBeyondGrantError, match="never outlives its grant") as caught:
        book.decide_renewal(f"{ROOT}/sa-1", T0 + 101, T0 + 1)
    assert caught.value.reason == "renewal-beyond-grant"
    # Control: the same renewal of a lease that names no grant is granted.
    assert book.decide_renewal(f"{ROOT}/sa-2", T0 + 101, T0 + 1).expires_at_ms == T0 + 101


def test_a_renewal_past_an_ancestors_lease_is_refused() -> None:
    """A parent whose lease (folded from an older journal) outlives its own parent's
    does not let a grandchild outlive that ancestor."""
    child, grand, great = f"{ROOT}/sa-1", f"{ROOT}/sa-1/sa-1", f"{ROOT}/sa-1/sa-1/sa-1"
    book = LeaseBook()
    book.apply(BudgetLedgerOpened(lineage=ROOT, allocation=BIG), T0)
    for parent, lineage, until in ((ROOT, child, T0 + 100), (child, grand, T0 + 500)):
        book.apply(
            LeaseGranted(parent=parent, lineages=(lineage,), allocation=ONE, expires_at_ms=until),
            T0,
        )
    book.apply(
        LeaseGranted(parent=grand, lineages=(great,), allocation=ONE, expires_at_ms=T0 + 50), T0
    )
    with pytest.raises(RenewalBeyondParentError, match="a lease above it") as caught:
        book.decide_renewal(great, T0 + 101, T0 + 1)
    assert caught.value.reason == "renewal-beyond-parent"
    assert book.decide_renewal(great, T0 + 100, T0 + 1).expires_at_ms == T0 + 100  # control
    # A fan-out under the grandchild is bounded by the same ancestor.
    zero = Budget.zero()  # the grandchild has leased out all it holds
    with pytest.raises(LeaseEndedError, match="outlive"):
        book.decide_leases(grand, [(f"{grand}/sa-2", zero, T0 + 101, DIGEST)], T0 + 1)
    assert book.decide_leases(grand, [(f"{grand}/sa-2", zero, T0 + 100, DIGEST)], T0 + 1)


def test_a_spawned_lease_renewed_past_its_grant_is_refused_and_journaled(
    journal_url: str, tmp_path: Path
) -> None:
    keys = KeyStore(tmp_path / "home")
    with Journal.create(journal_url) as journal:
        register_root(journal, keys, "root", ceiling())
        svc = service(journal, keys)
        spawned = svc.spawn(svc.durable_caller("root"), intent(1, BIG))
        child = spawned.children[0]
        grant_end = child.grant.terms.expires_at_ms
        budgets = BudgetService(journal)
        with pytest.raises(RenewalBeyondGrantError):
            budgets.renew(str(child.lineage), grant_end + 1)
        (refused,) = _refusals(journal, "renew")
        assert (refused.lineage, refused.reason) == (str(child.lineage), "renewal-beyond-grant")
        assert not list(journal.entries(types=("LeaseRenewed",)))
        # Control: a lease that names no grant is renewed just as far.
        _lease(journal, f"{ROOT}/free", now_ms() + 60_000, grant=False)
        renewed = budgets.renew(f"{ROOT}/free", grant_end + 1)
        assert renewed == LeaseRenewed(
            lineage=f"{ROOT}/free", parent=ROOT, expires_at_ms=grant_end + 1
        )
        assert len(_refusals(journal, "renew")) == 1


# -- every stored end renders -------------------------------------------------------------


@pytest.mark.parametrize("until", [2**63, -1, 2**64, True, "1800000000000", 1.5])
def test_renew_to_a_value_no_journal_stores_is_bad_input_and_journals_nothing(
    journal_url: str, until: object
) -> None:
    with Journal.create(journal_url) as journal:
        _root(journal)
        _lease(journal, f"{ROOT}/sa-1", now_ms() + 60_000, grant=False)
        head = journal.head()
        with pytest.raises(BadInputError, match="whole number of epoch milliseconds"):
            BudgetService(journal).renew(f"{ROOT}/sa-1", until)  # type: ignore[arg-type]
        assert journal.head() == head
        # Control: a renewal it can store is journaled.
        BudgetService(journal).renew(f"{ROOT}/sa-1", now_ms() + 120_000)
        assert journal.head() != head


def test_renew_past_the_last_date_is_refused_and_journaled(journal_url: str) -> None:
    with Journal.create(journal_url) as journal:
        _root(journal)
        _lease(journal, f"{ROOT}/sa-1", now_ms() + 60_000, grant=False)
        budgets = BudgetService(journal)
        for until in (MAX_EXPIRY_MS + 1, INT64_MAX):
            with pytest.raises(ExpiryOutOfRangeError, match="year 9999") as caught:
                budgets.renew(f"{ROOT}/sa-1", until)
            assert caught.value.reason == "expiry-out-of-range"
        assert [r.reason for r in _refusals(journal, "renew")] == ["expiry-out-of-range"] * 2
        assert not list(journal.entries(types=("LeaseRenewed",)))
        # Control: the last instant that renders is granted, and renders.
        assert budgets.renew(f"{ROOT}/sa-1", MAX_EXPIRY_MS).expires_at_ms == MAX_EXPIRY_MS
        assert render_instant(MAX_EXPIRY_MS) == "9999-12-31 23:59:59Z"


def test_a_lease_past_the_last_date_is_refused() -> None:
    book = LeaseBook()
    book.apply(BudgetLedgerOpened(lineage=ROOT, allocation=BIG), T0)
    with pytest.raises(ExpiryOutOfRangeError):
        book.decide_leases(ROOT, [(f"{ROOT}/sa-1", ONE, MAX_EXPIRY_MS + 1, DIGEST)], T0)
    assert book.decide_leases(ROOT, [(f"{ROOT}/sa-1", ONE, MAX_EXPIRY_MS, DIGEST)], T0)


@given(st.integers(min_value=-(2**64), max_value=2**64))
def test_any_instant_renders_without_raising(ms: int) -> None:
    text = render_instant(ms)
    assert text.endswith("Z") if 0 <= ms <= MAX_EXPIRY_MS else str(ms) in text


@pytest.mark.parametrize(
    "args",
    [
        ("--for", "2562047788015h"),  # the report: journaled 2^63 - 1, then "internal error"
        ("--for", f"{INT64_MAX}ms"),  # parses, and now + it would not fit a journal
        ("--for", f"{100 * 366 * 24 + 1}h"),  # one hour more than a century
        ("--until-ms", str(MAX_EXPIRY_MS + 1)),
        ("--until-ms", str(INT64_MAX)),
    ],
)
def test_lease_renew_past_what_renders_exits_2_and_journals_nothing(
    tmp_path: Path, args: tuple[str, str]
) -> None:
    home = tmp_path / "home"
    assert charter("init", home=home).returncode == 0
    spawned = charter(
        "spawn", "--parent", ROOT, "--width", "1", "--objective", "scan the estate hosts",
        "--est-cost", "tokens=300k,wall=3m,cpu=3m,mem=3MiB,egress=3MB", home=home,
    )  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr
    db = f"sqlite:///{home / 'journal.db'}"
    with Journal.open(db) as journal:
        before = journal.head()
    result = charter("lease", "renew", f"{ROOT}/sa-1", *args, home=home)
    assert result.returncode == 2, result.stderr
    assert "internal error" not in result.stderr
    assert "Traceback" not in result.stderr
    with Journal.open(db) as journal:
        assert journal.head() == before
    # Control: a renewal within range reaches the lease book, which refuses it (the
    # lease ends with its grant) and journals that once, exit 4, no internal error.
    control = charter("lease", "renew", f"{ROOT}/sa-1", "--for", "1h", home=home)
    assert control.returncode == 4, control.stderr
    assert "internal error" not in control.stderr
    with Journal.open(db) as journal:
        assert [r.reason for r in _refusals(journal, "renew")] == ["renewal-beyond-grant"]


# -- a release commits before the lease's end ---------------------------------------------


def test_a_release_that_would_commit_after_the_lease_ended_is_refused_once(
    journal_url: str,
) -> None:
    """Decided while the lease was live (the service's clock says so), committed after
    its end (the journal stamps the real time): refused, journaled once, nothing
    released. Before, the journal recorded the release of an ended lease."""
    with Journal.create(journal_url) as journal:
        _root(journal)
        ended = now_ms() - 1_000
        # The ended lease last: an entry committed after its end would take it out of
        # the views (LeaseBook.retire), and the decision would refuse it before the
        # journal does (tests/budgets/test_retire.py); here the journal's deadline does.
        _lease(journal, f"{ROOT}/sa-2", now_ms() + 600_000, grant=True)
        _lease(journal, f"{ROOT}/sa-1", ended, grant=True)
        late = BudgetService(journal, clock=lambda: ended - 1)
        with pytest.raises(LeaseEndedError, match="ended before the release could commit") as e:
            late.release(f"{ROOT}/sa-1")
        assert e.value.reason == "lease-ended"
        (refused,) = _refusals(journal, "release")
        assert (refused.lineage, refused.reason) == (f"{ROOT}/sa-1", "lease-ended")
        assert not list(journal.entries(types=("LeaseReleased",)))
        # Control: the same service releases a lease whose end is still ahead.
        assert late.release(f"{ROOT}/sa-2") == LeaseReleased(lineage=f"{ROOT}/sa-2")
        assert len(_refusals(journal, "release")) == 1


def test_a_release_after_an_ancestors_end_is_refused(journal_url: str) -> None:
    child, grand = f"{ROOT}/sa-1", f"{ROOT}/sa-1/sa-1"
    with Journal.create(journal_url) as journal:
        _root(journal)
        ended = now_ms() - 1_000
        _lease(journal, child, ended, grant=False)
        _lease(journal, grand, now_ms() + 600_000, grant=False, parent=child)  # older journal
        with pytest.raises(LeaseEndedError):
            BudgetService(journal, clock=lambda: ended - 1).release(grand)
        assert [r.lineage for r in _refusals(journal, "release")] == [grand]
        assert not list(journal.entries(types=("LeaseReleased",)))


# -- worker-controlled text stays on one line --------------------------------------------


def test_a_lineage_with_a_newline_is_escaped_in_every_budget_message(journal_url: str) -> None:
    forged = "agent:root/sa-1\ncharter: granted everything"
    with Journal.create(journal_url) as journal:
        _root(journal)
        budgets = BudgetService(journal)
        for call in (
            lambda: budgets.record_usage(forged, ONE),
            lambda: budgets.release(forged),
            lambda: budgets.renew(forged, T0),
            lambda: LeaseBook().get(forged),
        ):
            with pytest.raises(CharterError) as caught:
                call()
            assert "\n" not in str(caught.value)
            assert "sa-1\\ncharter" in str(caught.value)


def test_a_renewal_decided_before_the_leases_release_does_not_commit_after_it(
    journal_url: str,
) -> None:
    """The renewal is decided on a live lease; before it commits, another writer
    releases that lease. The renewal is pinned to the lease's own stream, so it is
    decided again and refused (journaled once): before, it committed a renewal of a
    lease that had already ended."""
    with Journal.create(journal_url) as journal:
        _root(journal)
        _lease(journal, f"{ROOT}/sa-1", now_ms() + 600_000, grant=False)
        _lease(journal, f"{ROOT}/sa-2", now_ms() + 600_000, grant=False)
        budgets, rival = BudgetService(journal), BudgetService(journal)
        decide = budgets.view.book.decide_renewal

        def decide_then_lose(lineage: str, until: int, at: int) -> LeaseRenewed:
            event = decide(lineage, until, at)
            if lineage == f"{ROOT}/sa-1" and not list(journal.entries(types=("LeaseReleased",))):
                rival.release(lineage)
            return event

        budgets.view.book.decide_renewal = decide_then_lose  # type: ignore[method-assign]
        with pytest.raises(LeaseEndedError, match="cannot be renewed"):
            budgets.renew(f"{ROOT}/sa-1", now_ms() + 900_000)
        assert not list(journal.entries(types=("LeaseRenewed",)))
        assert [r.reason for r in _refusals(journal, "renew")] == ["lease-ended"]
        # Control: a lease nobody releases is renewed by the same service.
        assert budgets.renew(f"{ROOT}/sa-2", now_ms() + 900_000).lineage == f"{ROOT}/sa-2"


def test_a_release_decided_before_an_ancestors_release_does_not_commit_after_it(
    journal_url: str,
) -> None:
    """Releasing the parent ends the child's lease; a release of the child decided
    before that is pinned to the parent's stream, so it is decided again and refused
    (journaled once), never journaled as the end of a lease that had already ended."""
    child, grand = f"{ROOT}/sa-1", f"{ROOT}/sa-1/sa-1"
    with Journal.create(journal_url) as journal:
        _root(journal)
        _lease(journal, child, now_ms() + 600_000, grant=False)
        _lease(journal, grand, now_ms() + 300_000, grant=False, parent=child)
        budgets, rival = BudgetService(journal), BudgetService(journal)
        decide = budgets.view.book.decide_release

        def decide_then_lose(lineage: str, at: int) -> LeaseReleased:
            event = decide(lineage, at)
            if lineage == grand and not list(journal.entries(types=("LeaseReleased",))):
                rival.release(child)
            return event

        budgets.view.book.decide_release = decide_then_lose  # type: ignore[method-assign]
        with pytest.raises(LeaseEndedError, match="already ended"):
            budgets.release(grand)
        released = [e.event for e in journal.entries(types=("LeaseReleased",))]
        assert released == [LeaseReleased(lineage=child)]
        assert [r.lineage for r in _refusals(journal, "release")] == [grand]
