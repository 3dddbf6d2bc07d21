"""A worker the cell cannot give a sandbox (every host uid held) is refused, journaled
as its end (``failed_to_start``, with the reason), and the cell goes on: the next worker
runs once a uid is free. ``cell status`` says why workers wait (real sandboxes, both
backends; the independent fold after)."""

from __future__ import annotations

import time
from pathlib import Path

from charter.control import WorkerSpec
from charter.runner.events import WorkerEnded, WorkerStarted
from charter.runner.status import cell_status
from charter.sandbox import FIRST_SANDBOX_UID, hold_uid
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise

UID_RANGE = 1000  # charter.sandbox's reserved range of sandbox host uids
TRUE = WorkerSpec(argv=("/bin/true",))


def _ends(charter: object) -> dict[str, WorkerEnded]:
    journal = charter.journal  # type: ignore[attr-defined]
    return {
        e.event.lineage: e.event
        for e in journal.entries(types=("WorkerEnded",))
        if isinstance(e.event, WorkerEnded)
    }


def test_uid_exhaustion_refuses_the_worker_and_the_cell_goes_on(
    journal_url: str, tmp_path: Path, own_state: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        # A first run leaves the host's isolation probe's pass on record for this state.
        with running(make_cell(charter, None, own_state)) as cell:
            until_idle(cell)
        held = [hold_uid(own_state, FIRST_SANDBOX_UID + i) for i in range(UID_RANGE)]
        assert all(h is not None for h in held)  # every sandbox uid is held here now
        try:
            with running(make_cell(charter, None, own_state)) as cell:
                (refused,) = (str(c.lineage) for c in fan_out(charter, 1, TRUE).children)
                until_idle(cell, 60)
                end = _ends(charter)[refused]
                assert end.outcome == "failed_to_start", end
                assert "UidPoolExhaustedError" in end.reason, end.reason
                for h in held:
                    if h is not None:
                        h.release()
                held = []
                # The same cell goes on: the next worker runs.
                (runs,) = (str(c.lineage) for c in fan_out(charter, 1, TRUE).children)
                until_idle(cell, 60)
                assert _ends(charter)[runs].outcome == "exited"
        finally:
            for h in held:
                if h is not None:
                    h.release()
        started = {
            e.event.lineage
            for e in charter.journal.entries(types=("WorkerStarted",))
            if isinstance(e.event, WorkerStarted)
        }
        assert refused not in started
        assert runs in started
        history = journal_history(charter.journal)
        assert check_history(history).problems == []
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []


def test_cell_status_says_why_workers_wait(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        cell_name = charter.settings.cell
        first, second = (
            str(c.lineage)
            for c in fan_out(charter, 2, WorkerSpec(argv=("/bin/sleep", "60"))).children
        )
        report = cell_status(charter.journal, cell_name)
        assert report.state == "never-run"
        assert "no incarnation has run it" in report.waits
        why = {r.lineage: r.why for r in report.workers}
        assert "holds a processing slot" in why[first]
        assert why[second] == report.waits
        with running(make_cell(charter, None, state_dir)) as cell:
            deadline = time.monotonic() + 60
            while cell_status(charter.journal, cell_name).workers[0].status != "running":
                assert time.monotonic() < deadline, "the first worker did not start"
                time.sleep(0.05)
            report = cell_status(charter.journal, cell_name)
            assert report.state == "live"
            assert report.waits == "every processing slot is held: 1 of a cap of 1", report
            assert {r.lineage: r.why for r in report.workers}[second] == report.waits
            cell.kill(first, "the test is done with it")
            cell.kill(second, "the test is done with it")
            until_idle(cell)
        assert cell_status(charter.journal, cell_name).waits == ""  # nothing queues
