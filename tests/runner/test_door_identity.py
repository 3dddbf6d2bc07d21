"""The door knows a worker by its sandbox's host uid *and* cgroup, like the brokers: a
host process running as a live worker's uid is refused; the worker itself is served."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import charter.runner
from charter.runner.door import REFUSED
from charter.runner.events import WorkerResult
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import ASK_DOOR, PY, WHOAMI_AND_LINGER, python

CLIENT_DIR = str(Path(charter.runner.__file__).parent)


def _as_uid(uid: int, code: str, *args: str) -> str:
    """Run ``code`` on the host as ``uid`` (outside any sandbox cgroup)."""
    r = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
         PY, "-I", "-c", code, *args],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return r.stdout.strip() or r.stderr


def test_a_host_process_with_a_workers_uid_is_refused_at_the_door(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home") as charter:
        result = fan_out(charter, 1, python(WHOAMI_AND_LINGER))
        (worker,) = (str(c.lineage) for c in result.children)
        cell = make_cell(charter, None, state_dir, door=True)
        with running(cell):
            deadline = time.monotonic() + 60
            answered: list[str] = []
            while not answered:
                assert time.monotonic() < deadline, "the worker never answered"
                answered = [
                    e.event.text
                    for e in charter.journal.entries(types=("WorkerResult",))
                    if isinstance(e.event, WorkerResult) and e.event.lineage == worker
                ]
                time.sleep(0.05)
            # Control: the worker itself, from inside its sandbox, was served.
            assert answered == [worker]
            uid = cell.view.workers[worker].host_uid
            assert uid is not None
            door = str(cell.key_broker.path)
            # The attack: the same uid, on the host, outside the sandbox's cgroup.
            out = _as_uid(uid, ASK_DOOR, door, CLIENT_DIR)
            assert out.startswith(f"refused {REFUSED} "), out
            assert "not inside the worker's sandbox" in out
            cell.kill(worker, "test over")
            until_idle(cell)
