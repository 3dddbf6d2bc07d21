"""The commit window (issue: read skew). A usage of a child is stamped under the write
lock just before the child's lease expires, and its COMMIT is slow (a slow fsync, a
large group commit, a stalled leader). A fan-out of the parent decided in that window
must not re-lease the budget the child had already spent: the expiry of a child whose
charges may still be in flight counts as live until the journal has committed past it.
Both backends; the independent fold checks conservation at every position, and the
control (the window left open) shows the fold catches the overspend."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from charter.budgets import InsufficientBudgetError, LeaseBook
from charter.control import BudgetService
from charter.core import Budget, KeyStore, now_ms
from charter.ledger import ChainedPostgresProcessRecorder, ChainedSQLiteProcessRecorder, Journal
from tests.invariants import check_history, journal_history

from ._support import ceiling, intent, register_root, service

HOLD_S = 3.0  # how long the usage's commit is held after its stamp (the window)
ROOT = Budget.parse("tokens=100k,wall=10h,cpu=10h,mem=64GiB,egress=10GB")
SPENT = Budget.parse("tokens=100k,wall=0s,cpu=0s,mem=0B,egress=0B")


def _held(stored_events: Any) -> bool:
    return any(s.topic.startswith("UsageRecorded/") for s in stored_events)


class SlowUsageSQLite(ChainedSQLiteProcessRecorder):
    """The real recorder; a usage's transaction stays open HOLD_S after its stamp."""

    def _insert_events(self, c: Any, stored_events: Any, **kwargs: Any) -> Any:
        result = super()._insert_events(c, stored_events, **kwargs)
        if _held(stored_events):
            time.sleep(HOLD_S)
        return result


class SlowUsagePostgres(ChainedPostgresProcessRecorder):
    def _insert_stored_events(self, curs: Any, stored_events: Any, **kwargs: Any) -> Any:
        result = super()._insert_stored_events(curs, stored_events, **kwargs)
        if _held(stored_events):
            time.sleep(HOLD_S)
        return result


def _slow_env(url: str) -> dict[str, str]:
    name = "SlowUsageSQLite" if url.startswith("sqlite") else "SlowUsagePostgres"
    return {"APPLICATION_RECORDER_TOPIC": f"tests.budgets.test_commit_window:{name}"}


def _attack(url: str, home: Path) -> tuple[bool, Journal]:
    """Returns whether the racing fan-out was minted, and the journal to check."""
    keys = KeyStore(home)
    journal = Journal.create(url)
    register_root(journal, keys, "root", ceiling(ROOT))
    svc = service(journal, keys)
    root = svc.durable_caller("root")
    # One child holds the root's whole token budget for about 2 s.
    lasting = Budget.parse("tokens=100k,wall=2s,cpu=1h,mem=1GiB,egress=1GB")
    child = str(svc.spawn(root, intent(1, lasting)).children[0].lineage)
    expires = svc.resources.book.get(child).expires_at_ms
    assert expires is not None
    slow = Journal.open(url, env=_slow_env(url))
    failure: list[BaseException] = []

    def spend() -> None:  # stamped just before the child's end, committed HOLD_S later
        try:
            while now_ms() < expires - 400:
                time.sleep(0.01)
            BudgetService(slow).record_usage(child, SPENT)
        except BaseException as e:
            failure.append(e)

    worker = threading.Thread(target=spend)
    worker.start()
    while now_ms() <= expires + 300:  # the child has expired; its usage is in flight
        time.sleep(0.01)
    minted = True
    try:
        svc.spawn(root, intent(1, Budget.parse("tokens=100k,wall=1m,cpu=1m,mem=1GiB,egress=0")))
    except InsufficientBudgetError:
        minted = False
    worker.join()
    slow.close()
    if failure:
        raise failure[0]
    return minted, journal


def _root_spent(journal: Journal) -> int:
    book = LeaseBook()
    for entry in journal.entries():
        book.apply(entry.event, 0)
    return book.get("agent:root").subtree_spent.tokens


@pytest.mark.slow
def test_a_fan_out_in_the_commit_window_cannot_re_lease_spent_budget(
    journal_url: str, tmp_path: Path
) -> None:
    minted, journal = _attack(journal_url, tmp_path / "home")
    with journal:
        assert not minted  # the child's expiry was not final: its lease still counted
        assert _root_spent(journal) == 100_000  # the usage did land: nothing was lost
        found = check_history(journal_history(journal))
        assert found.problems == []
        # After the commit, the same fan-out is refused for the right reason: spent.
        svc = service(journal, KeyStore(tmp_path / "home"))
        with pytest.raises(InsufficientBudgetError):
            svc.spawn(
                svc.durable_caller("root"),
                intent(1, Budget.parse("tokens=100k,wall=1m,cpu=1m,mem=1GiB,egress=0")),
            )


@pytest.mark.slow
def test_control_with_the_window_open_the_fold_finds_the_overspend(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: a book that takes every expiry as final (as before) mints the
    racing fan-out, and the independent fold reports the root overspent."""
    monkeypatch.setattr(LeaseBook, "_unsettled", lambda self, ledger, settled: (0,) * 5)
    minted, journal = _attack(journal_url, tmp_path / "home")
    with journal:
        assert minted
        # The new child spends what the root lent it: 200k of a 100k budget in all.
        lineage = next(
            e.event.lineages[-1]  # type: ignore[attr-defined]
            for e in reversed(list(journal.entries(types=("LeaseGranted",))))
        )
        BudgetService(journal).record_usage(lineage, SPENT)
        found = check_history(journal_history(journal))
        assert any(" uses " in p and "agent:root" in p for p in found.problems), found
