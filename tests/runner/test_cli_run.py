"""An operator schedules workers from the command line: `charter spawn … -- CMD`
schedules CMD for each child on this host's cell, and `charter cell run --once` runs
them in sandboxes; without a command, nothing is scheduled (real sandboxes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from charter.app import Charter
from charter.core import KeyStore
from charter.runner.events import WorkerResult

ROOT_DIR = Path(__file__).resolve().parents[2]
SPAWN = ["spawn", "--parent", "agent:estate", "--width", "2", "--objective",
         "echo a greeting from each worker", "--est-cost",
         "tokens=100k,wall=2m,cpu=1m,mem=512MiB,egress=0"]  # fmt: skip


def _charter(url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT_DIR)}
    return subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, "--quiet", *args],
        env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


@pytest.mark.sandbox
def test_charter_spawn_with_a_command_schedules_and_the_cell_runs_it(
    sqlite_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    budget = "tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=0"
    assert (
        _charter(sqlite_url, home, "init", "--root", "estate", "--budget", budget).returncode == 0
    )
    plain = _charter(sqlite_url, home, *SPAWN)  # the control: minted, nothing to run
    assert plain.returncode == 0, plain.stderr
    run = _charter(sqlite_url, home, *SPAWN, "--", "/bin/echo", "hello")
    assert run.returncode == 0, run.stderr
    cell = _charter(sqlite_url, home, "cell", "run", "--once", "--ignore-host-load")
    assert cell.returncode == 0, cell.stderr
    with Charter.open(sqlite_url, keys=KeyStore(home)) as charter:
        results = {
            e.event.lineage: e.event.text
            for e in charter.journal.entries(types=("WorkerResult",))
            if isinstance(e.event, WorkerResult)
        }
    assert results == {"agent:estate/sa-3": "hello\n", "agent:estate/sa-4": "hello\n"}
