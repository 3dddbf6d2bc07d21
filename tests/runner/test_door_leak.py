"""A worker that dies while its ``wait`` is queued for a processing slot takes its door
thread with it: the thread no longer polls the cell for ever (alive after the cell is
idle, and after it is closed). Real sandboxes, a real cell."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from charter.budgets import SlotQueued
from tests.invariants import check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import COST, PRELUDE, python

# Spawns one child (which cannot run: the only processing slot is taken meanwhile),
# waits on it for argv[1] seconds, then queues for its processing slot again.
WAITER = (
    PRELUDE
    + f"""
door = charter_door.Door()
kids = door.spawn({{"width": 1, "objective": "echo one number",
                   "estimated_cost": {{"tokens": 10_000, **{COST!r}}}}},
                  [{{"argv": ["/bin/echo", "1"]}}])["children"]
door.wait(kids, float(sys.argv[1]))
door.result("never: killed while queued")
"""
)
SLEEPER = "import time; time.sleep(600)"


def _until(what: str, check: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_waiter_killed_while_queued_leaves_no_door_thread(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1, coordination=2) as charter:
        result = fan_out(charter, 2, python(WAITER, "2"), python(SLEEPER), fanout=2, depth=2)
        waiter, sleeper = (str(c.lineage) for c in result.children)
        cell = make_cell(charter, None, state_dir, door=True)
        with running(cell):

            def queued_again() -> bool:
                # The waiter's second SlotQueued: after its wait, behind the sleeper.
                events = charter.journal.entries(types=("SlotQueued",))
                queued = [e.event for e in events if isinstance(e.event, SlotQueued)]
                return any(q.lineages == (waiter,) for q in queued)

            _until("the waiter queued for its processing slot", queued_again)
            uid = cell.view.workers[waiter].host_uid
            assert uid is not None
            threads = [t for t in threading.enumerate() if t.name == f"door-conn-{uid}"]
            assert len(threads) == 1  # the waiter's connection, polling for its slot
            (thread,) = threads
            thread.join(0.5)
            assert thread.is_alive()  # control: while the waiter lives it is served
            cell.kill(waiter, "test: the waiter dies while queued")
            thread.join(30)
            assert not thread.is_alive()  # the attack's symptom: it polled for ever
            cell.kill(sleeper, "test over")
            until_idle(cell)
        assert not thread.is_alive()
        history = journal_history(charter.journal)
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
