"""Settled time across hosts whose clocks differ (PostgreSQL serves writers on many
hosts; SQLite's writers share one host, where the same happens when a clock steps back).

A child holds the root's whole budget and expires. Just after its end, the root fans out
again: the child's expiry came after the last commit it read, so the decision settles
the journal first and takes the expiry as final. Between that read and the fan-out's
commit, a writer on a host whose clock is 5 s behind records the child's usage: by its
clock the lease is still live. The commit time it stamps is its clock, or the head's if
later; settling committed a ``BudgetSettled`` entry, so the head's time is past the
child's end and the journal's deadline refuses the usage. The fan-out commits; the
independent fold finds nothing at any position.

Those two run the settle commit alone (``Settling.pin_head`` off): the fallback a
fan-out takes once its head pin lost. With the head pin (the first try), the usage from
the host behind commits between the fan-out's read and its append, so the pin loses;
the fan-out is decided again, settles, reads the usage, and is refused: nothing is
re-leased, and the fold finds nothing.

The control settles as before this fix: the write lock taken and given back, and this
host's clock read under it taken as the settled time (``Journal.barrier_ms``). That time
was never committed, so the usage from the host behind is stamped before the child's
end and commits, and the fold finds the root at twice its budget.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from charter.control import resources
from charter.core import Budget, RefusedError, now_ms
from charter.ledger import Journal
from tests.invariants import check_history, journal_history

from ._support import a_root_and_a_child, intent

ROOT_DIR = Path(__file__).resolve().parents[2]
SKEW_MS = 5_000
ROOT = Budget.parse("tokens=100k,wall=10h,cpu=10h,mem=64GiB,egress=10GB")
BRIEF = Budget.parse("tokens=100k,wall=2s,cpu=1h,mem=1GiB,egress=1GB")
LATER = Budget.parse("tokens=100k,wall=1m,cpu=1m,mem=1GiB,egress=0")


def _attack(url: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[bool, str, Journal]:
    """Whether the fan-out minted, what the host behind was told, and the journal."""
    brief = a_root_and_a_child(url, home, ROOT, BRIEF)
    journal, svc, root, child, expires = (
        brief.journal, brief.svc, brief.root, brief.child, brief.expires_ms
    )  # fmt: skip
    behind = subprocess.Popen(
        [sys.executable, "-m", "tests.budgets._behind", url, child, str(SKEW_MS)],
        cwd=ROOT_DIR,
        env={"PYTHONPATH": str(ROOT_DIR), "PATH": "/usr/bin:/bin"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert behind.stdin is not None
    assert behind.stdout is not None
    assert behind.stdout.readline().strip() == "ready"
    said: list[str] = []
    append = journal.append

    def between_the_read_and_the_commit(events: Any, **kwargs: Any) -> Any:
        if not said and any(type(e).__name__ == "LeaseGranted" for e in events):
            behind.stdin.write("go\n")  # type: ignore[union-attr]
            behind.stdin.flush()  # type: ignore[union-attr]
            said.append(behind.stdout.readline().strip())  # type: ignore[union-attr]
        return append(events, **kwargs)

    monkeypatch.setattr(journal, "append", between_the_read_and_the_commit)
    while now_ms() <= expires + 300:  # just after the child's end
        time.sleep(0.01)
    try:
        svc.spawn(root, intent(1, LATER))
        minted = True
    except RefusedError:
        minted = False
    assert behind.wait(timeout=60) == 0
    return minted, said[0] if said else "", journal


@pytest.mark.slow
def test_a_writer_whose_clock_is_behind_cannot_spend_what_a_settled_fan_out_re_leased(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resources.Settling, "pin_head", False)  # the settle commit alone
    minted, said, journal = _attack(journal_url, tmp_path / "home", monkeypatch)
    with journal:
        found = check_history(journal_history(journal))
        settles = list(journal.entries(types=("BudgetSettled",)))
    assert minted  # the child's budget came back, and was leased again
    assert said == "refused LeaseEndedError"  # past the child's end, in journal time
    assert len(settles) == 1
    assert found.problems == []


def _settle_by_this_clock(
    journal: Journal, shared: resources.Shared, lineage: str, at_ms: int
) -> bool:
    """How settling worked before: this host's clock, read under the write lock."""
    view = shared.resources
    if lineage not in view.book or not view.book.unsettled(lineage, at_ms, view.settled_ms):
        return False
    barrier = journal.barrier_ms()
    shared.refresh(journal)
    view.settled_ms = max(view.settled_ms, barrier)
    return True


@pytest.mark.slow
def test_control_settled_by_this_hosts_clock_the_fold_finds_the_overspend(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resources, "settle", _settle_by_this_clock)
    monkeypatch.setattr(resources.Settling, "pin_head", False)
    minted, said, journal = _attack(journal_url, tmp_path / "home", monkeypatch)
    with journal:
        found = check_history(journal_history(journal))
    assert minted
    assert said == "committed"  # stamped before the child's end, after the decision read
    assert any(p.split(": ", 1)[1].startswith("agent:root uses ") for p in found.problems)


@pytest.mark.slow
def test_a_usage_from_the_host_behind_makes_the_fan_out_s_head_pin_lose(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    minted, said, journal = _attack(journal_url, tmp_path / "home", monkeypatch)
    with journal:
        found = check_history(journal_history(journal))
        settles = list(journal.entries(types=("BudgetSettled",)))
    assert said == "committed"  # between the fan-out's read and its pinned append
    assert not minted  # the pin lost; decided again, settled, the usage read: refused
    assert len(settles) == 1  # the fallback's commit
    assert found.problems == []
