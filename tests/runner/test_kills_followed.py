"""The cell carries out every committed kill, whoever appended it: a `WorkerKilled`
written by another process kills a running worker that would otherwise have completed
(its recorded end says killed, and it ended early), and a queued worker killed before it
started never starts (real sandboxes, both backends)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from charter.control import WorkerSpec
from charter.runner.events import WorkerEnded, WorkerStarted
from charter.sandbox import SandboxExited
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise

ROOT_DIR = Path(__file__).resolve().parents[2]
SLEEP_S = 8  # the control's workers run this long, to completion
# The killed ones would sleep far longer: on a loaded host the kill, appended by a fresh
# interpreter, may take longer than SLEEP_S to arrive, and the worker must still be
# running when it does (the kill, not the clock, ends it).
KILLED_SLEEP_S = 600


def _kill_from_another_process(url: str, lineage: str) -> None:
    code = (
        "import sys\n"
        "from charter.ledger import Journal\n"
        "from charter.runner.events import WorkerKilled\n"
        "with Journal.open(sys.argv[1]) as j:\n"
        "    j.append([WorkerKilled(lineage=sys.argv[2], reason='the operator said so')])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT_DIR)}
    subprocess.run([sys.executable, "-c", code, url, lineage], check=True, env=env)


def _wait_started(charter: object, lineage: str, timeout: float = 60) -> None:
    journal = charter.journal  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = journal.entries(types=("WorkerStarted",))
        if any(isinstance(e.event, WorkerStarted) and e.event.lineage == lineage for e in started):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{lineage} did not start")


@pytest.mark.sandbox
@pytest.mark.parametrize("killed", [True, False], ids=["killed", "control"])
def test_a_kill_appended_by_another_process_is_carried_out(
    journal_url: str, tmp_path: Path, state_dir: Path, killed: bool
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        sleeper = WorkerSpec(argv=("/bin/sleep", str(KILLED_SLEEP_S if killed else SLEEP_S)))
        result = fan_out(charter, 2, sleeper)  # one slot: the second is queued
        first, second = (str(c.lineage) for c in result.children)
        cell = make_cell(charter, None, state_dir)
        with running(cell):
            if killed:
                _kill_from_another_process(journal_url, second)  # queued: never starts
                _wait_started(charter, first)
                _kill_from_another_process(journal_url, first)  # running: killed now
            until_idle(cell, 60)
        entries = list(charter.journal.entries())
        ends = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        started = {e.event.lineage for e in entries if isinstance(e.event, WorkerStarted)}
        exits = [e.event for e in entries if isinstance(e.event, SandboxExited)]
        # How long a worker ran, by the journal's own commit times (not the test's
        # clock, which counts the cell's start and interpreters' start-up under load).
        at = {
            (type(e.event).__name__, e.event.lineage): e.recorded_at
            for e in entries
            if isinstance(e.event, (WorkerStarted, WorkerEnded))
        }

        def ran(lineage: str) -> float:
            return (at["WorkerEnded", lineage] - at["WorkerStarted", lineage]).total_seconds()

        if killed:
            assert ends[first].outcome == "killed"
            assert ends[second].outcome == "killed"
            assert second not in started  # killed while queued: it never ran
            assert exits[0].exit_code != 0
            assert ran(first) < KILLED_SLEEP_S  # it did not run to completion
        else:  # the control: the same workers complete when nobody kills them
            assert [ends[x].outcome for x in (first, second)] == ["exited", "exited"]
            assert {first, second} <= started
            assert ran(first) >= SLEEP_S
            assert ran(second) >= SLEEP_S
        history = journal_history(charter.journal)
        assert check_history(history).problems == []
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
