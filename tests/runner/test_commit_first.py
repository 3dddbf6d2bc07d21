"""Nothing starts that was not committed: a schedule whose append fails leaves nothing
to run; a start whose record fails never execs (and starts once the journal takes it);
a worker killed while queued never starts; a peer that is no worker is refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from charter.control import WorkerSpec
from charter.ledger import AppendFailedError
from charter.runner import NotAWorkerError
from charter.runner.events import WorkerEnded, WorkerKilled, WorkerStarted
from charter.sandbox import SandboxStarted
from tests.invariants import check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, until_idle
from tests.runner.conftest import initialise

ECHO = WorkerSpec(argv=("/bin/echo", "ran"))


def _refuse(db: Path, event: str) -> sqlite3.Connection:
    conn = sqlite3.connect(db)
    conn.execute(
        f"CREATE TRIGGER refuse_{event} BEFORE INSERT ON stored_events "
        f"WHEN NEW.topic LIKE '{event}/%' BEGIN SELECT RAISE(ABORT, 'injected'); END"
    )
    conn.commit()
    return conn


def test_a_schedule_that_does_not_commit_never_runs(
    sqlite_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(sqlite_url, tmp_path / "home") as charter:
        refuse = _refuse(tmp_path / "journal.db", "WorkerScheduled")
        head = charter.journal.head()
        with pytest.raises(AppendFailedError):
            fan_out(charter, 2, ECHO)
        assert charter.journal.head() == head  # not the mints, leases or slots either
        cell = make_cell(charter, None, state_dir)
        cell.open()
        try:
            assert cell.step() == 0
            assert cell.idle()
        finally:
            cell.close()
        assert list(charter.journal.entries(types=("SandboxStarted",))) == []
        refuse.execute("DROP TRIGGER refuse_WorkerScheduled")
        refuse.commit()


def test_a_start_that_does_not_commit_never_execs_and_runs_once_it_does(
    sqlite_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(sqlite_url, tmp_path / "home") as charter:
        (lineage,) = (str(c.lineage) for c in fan_out(charter, 1, ECHO).children)
        refuse = _refuse(tmp_path / "journal.db", "WorkerStarted")
        cell = make_cell(charter, None, state_dir)
        cell.open()
        try:
            assert cell.step() == 0  # the record failed: no exec
            assert list(charter.journal.entries(types=("SandboxStarted", "WorkerResult"))) == []
            assert cell.pool is not None
            assert cell.pool.leased == 0  # the slot went back
            refuse.execute("DROP TRIGGER refuse_WorkerStarted")
            refuse.commit()
            assert cell.step() == 1  # positive control: the same schedule, now recorded
            until_idle(cell)
        finally:
            cell.close()
        entries = list(charter.journal.entries())
        assert [e.event.lineage for e in entries if isinstance(e.event, WorkerStarted)] == [lineage]
        assert sum(isinstance(e.event, SandboxStarted) for e in entries) == 1
        history = journal_history(charter.journal)
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []


def test_a_worker_killed_while_queued_never_starts(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        result = fan_out(charter, 2, ECHO)
        running, queued = (str(c.lineage) for c in result.children)
        assert result.queued == (queued,)
        cell = make_cell(charter, None, state_dir)
        cell.open()
        try:
            cell.kill(queued, "the operator changed their mind")
            cell.step()
            until_idle(cell)
            with pytest.raises(NotAWorkerError):
                cell.lineage_of(0)  # root on the host is no worker of this cell
        finally:
            cell.close()
        entries = list(charter.journal.entries())
        started = [e.event.lineage for e in entries if isinstance(e.event, WorkerStarted)]
        assert started == [running]
        ended = {
            e.event.lineage: e.event.outcome for e in entries if isinstance(e.event, WorkerEnded)
        }
        assert ended == {running: "exited", queued: "killed"}
        assert any(isinstance(e.event, WorkerKilled) for e in entries)
        history = journal_history(charter.journal)
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
