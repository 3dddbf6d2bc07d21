"""Draining a cell: `charter cell drain` (a SIGTERM to its `cell run`) starts nothing
more and stops once the running workers finish, each ending by itself; a second SIGTERM
stops it at once, killing what runs (journaled first). Real sandboxes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from charter.app import Charter
from charter.control import WorkerSpec
from charter.core import KeyStore
from charter.runner.events import WorkerEnded, WorkerStarted
from tests.runner._support import fan_out
from tests.runner.conftest import initialise

ROOT_DIR = Path(__file__).resolve().parents[2]


def _env(home: Path, state_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "CHARTER_HOME": str(home),
        "PYTHONPATH": str(ROOT_DIR),
        "CHARTER_SANDBOX_STATE": str(state_dir),
    }


def _events(url: str, home: Path, kind: type) -> list[object]:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        return [e.event for e in charter.journal.entries() if isinstance(e.event, kind)]


@pytest.mark.sandbox
@pytest.mark.parametrize("twice", [False, True], ids=["drained", "second-sigterm"])
def test_a_drained_cell_lets_its_workers_finish_and_starts_nothing_more(
    sqlite_url: str, tmp_path: Path, state_dir: Path, twice: bool
) -> None:
    home = tmp_path / "home"
    with initialise(sqlite_url, home, processing=1) as charter:
        # The first runs long enough for `cell drain` (a fresh interpreter, slow on a
        # loaded host) to arrive before it ends: else the cell could start the second.
        result = fan_out(charter, 2, WorkerSpec(argv=("/bin/sleep", "12")))
    first, second = (str(c.lineage) for c in result.children)
    env = _env(home, state_dir)
    cell = subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", sqlite_url, "--quiet", "cell", "run",
         "--ignore-host-load"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _events(sqlite_url, home, WorkerStarted):
            assert time.monotonic() < deadline, "the cell did not start its first worker"
            time.sleep(0.05)
        drained = subprocess.run(
            [sys.executable, "-m", "charter", "--db", sqlite_url, "cell", "drain"],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert drained.returncode == 0, drained.stderr
        if twice:
            cell.send_signal(signal.SIGTERM)  # the second: stop now
        _, err = cell.communicate(timeout=60)
        assert cell.returncode == 0, err
    finally:
        if cell.poll() is None:
            cell.kill()
    started = [e.lineage for e in _events(sqlite_url, home, WorkerStarted)]  # type: ignore[attr-defined]
    ends = {e.lineage: e.outcome for e in _events(sqlite_url, home, WorkerEnded)}  # type: ignore[attr-defined]
    assert started == [first]  # the queued one was never started
    assert second not in ends  # and is still scheduled, for the next cell run
    assert ends[first] == ("killed" if twice else "exited")
