"""Issue 23 point 9 with a real cell: a ``charter cell run`` SIGKILLed while its worker
runs leaves its door's sockets, named ``KIND-CELL-PID.sock``; ``charter sandbox reap``
removes them and counts them. The control: while the cell lives, the same reap keeps
them (tests/sandbox/test_sweep_names.py has the naming rule's cases)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.app import Charter
from charter.control import WorkerSpec
from charter.core import KeyStore
from tests.runner._support import fan_out
from tests.runner.conftest import initialise

WT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_state() -> Iterator[Path]:
    """A sandbox state directory of this test's own (its sockets alone are in it)."""
    path = Path(tempfile.mkdtemp(prefix="charter-killed-cell-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
    env = {**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": str(WT),
           "CHARTER_SANDBOX_STATE": str(own_state)}  # fmt: skip
    cell = subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", journal_url, "--quiet", "cell", "run",
         "--once", "--ignore-host-load"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _started(journal_url, home):
            assert cell.poll() is None, cell.stderr.read().decode() if cell.stderr else ""
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
