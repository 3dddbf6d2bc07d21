"""Budget conservation and authority under races (SQLite and PostgreSQL): a decision
that relied on a lease being live cannot commit after it ended, a fan-out is pinned to
every ancestor, and commit times never run backwards. Each history is then checked by
the independent fold in tests/invariants.py."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from charter.budgets import BudgetRefused, LeaseEndedError
from charter.control import BudgetService
from charter.core import Budget, KeyStore, now_ms
from charter.ledger import Journal
from tests.invariants import check_history, journal_history

from ._support import ROOT_BUDGET, ceiling, intent, register_root, service

ROOT_DIR = Path(__file__).resolve().parents[2]


def test_the_independent_fold_finds_what_it_is_for() -> None:
    """Positive controls: an overspent parent, a usage after its lease's end and a
    commit time that runs backwards are each reported at their position."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    one = {"tokens": 10, "wall_ms": 10, "cpu_ms": 10, "mem_bytes": 10, "egress_bytes": 10}
    half = dict.fromkeys(one, 6)
    history: list[tuple[int, str, dict[str, Any], datetime]] = [
        (1, "BudgetLedgerOpened", {"lineage": "r", "allocation": one}, t0),
        (2, "LeaseGranted", {"parent": "r", "lineages": ["a"], "allocation": half,
                             "expires_at_ms": 10**15}, t0),
        (3, "LeaseGranted", {"parent": "r", "lineages": ["b"], "allocation": half,
                             "expires_at_ms": 10**15}, t0),
        (4, "LeaseReleased", {"lineage": "a"}, t0 + timedelta(seconds=1)),
        (5, "UsageRecorded", {"lineage": "a", "amount": half}, t0 + timedelta(seconds=2)),
        (6, "LeaseReleased", {"lineage": "b"}, t0),
    ]  # fmt: skip
    found = check_history(history)
    assert any(p.startswith("3: r uses") for p in found.problems), found.problems
    assert any(p.startswith("5: usage of a after the end") for p in found.problems)
    assert any(p.startswith("6: commit time") for p in found.problems)
    assert check_history(history[:2]).problems == []  # and a clean prefix is clean


@pytest.mark.parametrize("parent_re_leases", [True, False])
def test_a_usage_held_past_its_lease_end_is_refused_and_journaled(
    journal_url: str, tmp_path: Path, parent_re_leases: bool
) -> None:
    """Decided just before the lease expires, held until after (while the parent
    leases the returned budget again, or while nothing else happens): the usage must
    not commit (the parent's budget would be spent twice, or a usage lands after its
    lease's end). The pins catch the first case; the deadline the journal checks under
    its lock catches both."""
    keys = KeyStore(tmp_path / "home")
    with Journal.create(journal_url) as journal:
        register_root(journal, keys, "root", ceiling())
        svc = service(journal, keys)
        root = svc.durable_caller("root")
        lasting = Budget.parse("tokens=4M,wall=2s,cpu=1h,mem=1GiB,egress=1GB")
        child = str(svc.spawn(root, intent(1, lasting)).children[0].lineage)
        worker, operator = BudgetService(journal), BudgetService(journal)
        worker.record_usage(child, lasting.split(100))  # control: usage while it is live
        expires = worker.view.book.get(child).expires_at_ms
        assert expires is not None
        decide = worker.view.book.decide_usage

        def decide_then_hold(*args: Any, **kwargs: Any) -> Any:
            event = decide(*args, **kwargs)
            while now_ms() <= expires:  # held past the lease's end (bounded by it)
                time.sleep(0.01)
            if parent_re_leases:  # what came back, all of it, to a new child
                svc.spawn(root, intent(1, operator.remaining("agent:root")))
            return event

        worker.view.book.decide_usage = decide_then_hold  # type: ignore[method-assign]
        with pytest.raises(LeaseEndedError):
            worker.record_usage(child, lasting.split(2))
        usages = list(journal.entries(types=("UsageRecorded",)))
        assert len(usages) == 1  # only the control's
        refusals = [e.event for e in journal.entries(types=("BudgetRefused",))]
        assert [(r.lineage, r.reason) for r in refusals if isinstance(r, BudgetRefused)] == [
            (child, "lease-ended")
        ]
        found = check_history(journal_history(journal))
        assert found.problems == []
        assert found.checked > 0


def test_a_release_racing_a_descendants_fan_out_never_lets_it_commit(
    journal_url: str, tmp_path: Path
) -> None:
    """C is released (its whole subtree ends) between grandchild G's decision to fan
    out and G's append: the append is pinned to C's stream, so it does not commit, and
    the re-decision is refused. Without the race, G fans out (the control)."""
    keys = KeyStore(tmp_path / "home")
    with Journal.create(journal_url) as journal:
        register_root(journal, keys, "root", ceiling())
        svc = service(journal, keys)
        root = svc.durable_caller("root")
        half = ROOT_BUDGET.split(2)
        c = root.child(svc.spawn(root, intent(1, half)).children[0])
        g = c.child(svc.spawn(c, intent(1, half.split(2))).children[0])
        svc.spawn(g, intent(1, half.split(100), fanout=0))  # control: G fans out while C lives
        operator = BudgetService(journal)
        decide_leases = svc.resources.book.decide_leases
        racing = [c.claimed]

        def decide_then_release(*args: Any, **kwargs: Any) -> Any:
            leases = decide_leases(*args, **kwargs)
            while racing:
                operator.release(racing.pop())  # lands between decision and append
            return leases

        svc.resources.book.decide_leases = decide_then_release  # type: ignore[method-assign]
        with pytest.raises(LeaseEndedError):
            svc.spawn(g, intent(2, half.split(100), fanout=0))
        minted_under_g = [
            e
            for e in journal.entries(types=("GrantMinted",))
            if str(e.event.lineage).startswith(g.claimed + "/")  # type: ignore[attr-defined]
        ]
        assert len(minted_under_g) == 1  # only the control's
        found = check_history(journal_history(journal))
        assert found.problems == []


def _writers(url: str, count: int, appends: int) -> list[subprocess.Popen[bytes]]:
    code = (
        "import sys; from charter.app import Charter; from charter.budgets import BudgetRefused\n"
        "with Charter.open(sys.argv[1]) as c:\n"
        "    for i in range(int(sys.argv[2])):\n"
        "        c.journal.append([BudgetRefused(lineage='w', operation='usage', "
        "reason='r', message=str(i))])\n"
    )
    return [
        subprocess.Popen(
            [sys.executable, "-c", code, url, str(appends)],
            cwd=ROOT_DIR,
            env={"PYTHONPATH": str(ROOT_DIR), "PATH": "/usr/bin:/bin"},
        )
        for _ in range(count)
    ]


def test_commit_times_never_decrease_with_position_under_sixteen_writers(
    journal_url: str, tmp_path: Path
) -> None:
    keys = KeyStore(tmp_path / "home")
    with Journal.create(journal_url) as journal:
        register_root(journal, keys, "root", ceiling())
    writers = _writers(journal_url, 16, 40)
    for w in writers:
        assert w.wait(timeout=300) == 0
    with Journal.open(journal_url) as journal:
        times = [e.recorded_at for e in journal.entries()]
        found = check_history(journal_history(journal))
    assert len(times) == 3 + 16 * 40
    assert times == sorted(times)
    assert found.problems == []
