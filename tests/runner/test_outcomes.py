"""A worker's recorded end says what happened, in one vocabulary, derived from what the
sandbox measured (its exit status, its cgroup's OOM kills, the wall clock) and what was
committed (a kill): each outcome a real sandbox can produce, produced by one (both
backends; the independent fold after)."""

from __future__ import annotations

import time
from pathlib import Path

from charter.app import Charter
from charter.control import end_outcome
from charter.runner.events import WorkerEnded, WorkerStarted
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import PY
from tests.runner.test_lease_caps import SLOT, spawn_one

LEASE = "wall=60s,cpu=60s,mem=96MiB,egress=0"  # memory: a cap the OOM case goes over
BRIEF = "wall=3s,cpu=60s,mem=96MiB,egress=0"  # its wall clock runs out
TINY = "wall=60s,cpu=60s,mem=16MiB,egress=0"  # below a sandbox's minimum: never starts


def _ends(charter: Charter) -> dict[str, WorkerEnded]:
    return {
        e.event.lineage: e.event
        for e in charter.journal.entries(types=("WorkerEnded",))
        if isinstance(e.event, WorkerEnded)
    }


def test_each_end_a_sandbox_can_produce_is_recorded_as_what_happened(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=8) as charter:
        workers = {
            "completed": spawn_one(charter, LEASE, ("/bin/true",)),
            "exit-3": spawn_one(charter, LEASE, ("/bin/sh", "-c", "exit 3")),
            "signal": spawn_one(charter, LEASE, ("/bin/sh", "-c", "kill -SEGV $$")),
            "oom": spawn_one(
                charter, LEASE, (PY, "-I", "-c", "b = b'x' * (512 << 20); print(len(b))")
            ),
            "timeout": spawn_one(
                charter, "wall=3s,cpu=60s,mem=96MiB,egress=0", ("/bin/sleep", "60")
            ),
            "killed": spawn_one(charter, LEASE, ("/bin/sleep", "60")),
            "no-start": spawn_one(charter, TINY, ("/bin/true",)),
        }
        with running(make_cell(charter, None, state_dir, budget=SLOT)) as cell:
            deadline = time.monotonic() + 60
            while not any(
                isinstance(e.event, WorkerStarted) and e.event.lineage == workers["killed"]
                for e in charter.journal.entries(types=("WorkerStarted",))
            ):
                assert time.monotonic() < deadline, "the sleeper did not start"
                time.sleep(0.05)
            cell.kill(workers["killed"], "the operator killed it")
            until_idle(cell, 120)
        ends = _ends(charter)
        got = {
            name: (ends[x].outcome, ends[x].exit_code, ends[x].signal)
            for name, x in workers.items()
        }
        assert got == {
            "completed": ("exited", 0, None),
            "exit-3": ("exited", 3, None),
            "signal": ("signalled", 139, 11),
            "oom": ("oom_killed", 137, 9),
            "timeout": ("timed_out", 124, None),
            "killed": ("killed", 137, 9),
            "no-start": ("failed_to_start", None, None),
        }, got
        assert ends[workers["signal"]].reason.startswith("it died of signal 11")
        assert "OOM" in ends[workers["oom"]].reason
        assert "wall clock" in ends[workers["timeout"]].reason
        assert ends[workers["killed"]].reason == "the operator killed it"
        assert "not started" in ends[workers["no-start"]].reason
        history = journal_history(charter.journal)
        assert check_history(history).problems == []
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []


def test_the_outcome_is_derived_from_what_was_measured() -> None:
    # A kill's SIGKILL is the kill's, even when the cgroup also counted an OOM kill.
    assert end_outcome(how="signalled", exit_code=137, oom_kills=1, killed=True) == ("killed", 9)
    assert end_outcome(how="signalled", exit_code=137, oom_kills=1, killed=False) == (
        "oom_killed",
        9,
    )
    # A child OOM-killed while the worker itself exited is an exit, not an OOM kill.
    assert end_outcome(how="exited", exit_code=1, oom_kills=1, killed=False) == ("exited", None)
    assert end_outcome(how="wall_clock", exit_code=124, oom_kills=0, killed=False) == (
        "timed_out",
        None,
    )
    assert end_outcome(how="signalled", exit_code=143, oom_kills=0, killed=False) == (
        "signalled",
        15,
    )
