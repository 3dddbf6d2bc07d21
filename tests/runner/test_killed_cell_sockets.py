"""Issue 23 point 9 with a real cell: a ``charter cell run`` SIGKILLed while its worker
runs leaves its door's sockets, named ``KIND-CELL-PID.sock``; ``charter sandbox reap``
removes them and counts them. The control: while the cell lives, the same reap keeps
them (tests/sandbox/test_sweep_names.py has the naming rule's cases)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from charter.app import Charter
from charter.control import WorkerSpec
from charter.core import KeyStore
from tests.runner._support import cell_process, cli_env, fan_out
from tests.runner.conftest import initialise


def _reap(env: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--json", "sandbox", "reap"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["removed"])


def _started(url: str, home: Path) -> bool:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        return any(True for _ in charter.journal.entries(types=("WorkerStarted",)))


@pytest.mark.sandbox
def test_a_sigkilled_cells_sockets_are_swept_by_reap(
    journal_url: str, tmp_path: Path, own_state: Path
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=1) as charter:
        fan_out(charter, 1, WorkerSpec(argv=("/bin/sleep", "120")))
    env = cli_env(home, own_state)
    cell = cell_process(journal_url, env)
    try:
        deadline = time.monotonic() + 120
        while not _started(journal_url, home):
            assert cell.poll() is None, f"the cell ended first (exit {cell.returncode})"
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.05)
        left = sorted(own_state.glob(f"*-{cell.pid}.sock"))
        assert any(p.name.startswith("door-") for p in left), left
        # Control: the cell lives, its sockets are served, the reap keeps them.
        _reap(env)
        assert all(p.exists() for p in left)
    finally:
        cell.send_signal(signal.SIGKILL)
        cell.wait()
    # The attack's aftermath: everything of the dead cell is swept, and said.
    removed = _reap(env)
    assert [p for p in left if p.exists()] == []
    assert removed >= len(left)
    assert list(own_state.glob("*.sock")) == []
