"""A restarted cell's recovery kills only what it may: a process under the dead
worker's host uid is killed only while the recovering cell holds that uid. Here a cell
process is SIGKILLed with a worker running; its uid is then taken by another holder
(this test, running a process as that uid): recovery fails the worker in the journal,
kill first, and leaves the other holder's process alone. The control: the same process
under a uid nobody holds (an orphan of the dead worker) is killed."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from charter.app import Charter
from charter.control import WorkerSpec
from charter.core import KeyStore
from charter.runner.events import WorkerEnded, WorkerKilled, WorkerStarted
from charter.sandbox import SandboxLeased, hold_uid
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import cell_process, cli_env, fan_out, make_cell
from tests.runner.conftest import initialise

ROOT_DIR = Path(__file__).resolve().parents[2]


def _started_uid(url: str, home: Path, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with Charter.open(url, keys=KeyStore(home)) as charter:
            entries = list(charter.journal.entries())
        if any(isinstance(e.event, WorkerStarted) for e in entries):
            return next(e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased))
        time.sleep(0.1)
    raise TimeoutError("the cell did not start its worker")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.sandbox
@pytest.mark.parametrize("taken", [True, False], ids=["uid-taken", "control-orphan"])
def test_recovery_never_kills_a_process_whose_uid_another_holder_took(
    journal_url: str, tmp_path: Path, state_dir: Path, taken: bool
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=1) as charter:
        result = fan_out(charter, 1, WorkerSpec(argv=("/bin/sleep", "60")))
    lineage = str(result.children[0].lineage)
    cell = cell_process(journal_url, cli_env(home, state_dir))
    try:
        uid = _started_uid(journal_url, home)
    finally:
        cell.send_signal(signal.SIGKILL)
        cell.wait()
    # The dead cell's sandbox dies with it; its uid is free again. Now a process runs
    # under that uid: another holder's (it holds the uid's lock), or an orphan's.
    deadline = time.monotonic() + 10
    holder = None
    while holder is None and time.monotonic() < deadline:
        holder = hold_uid(state_dir, uid)
        if holder is None:
            time.sleep(0.05)
    assert holder is not None, "the dead cell's uid was never released"
    other = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                              "sleep", "60"])  # fmt: skip
    try:
        if not taken:
            holder.release()  # nobody holds it: the process is an orphan under it
        with Charter.open(journal_url, keys=KeyStore(home)) as charter:
            recovering = make_cell(charter, None, state_dir)
            recovering.open()
            try:
                assert _alive(other.pid) is taken
                entries = list(charter.journal.entries())
                kill = next(
                    e.position
                    for e in entries
                    if isinstance(e.event, WorkerKilled) and e.event.lineage == lineage
                )
                end = next(
                    e
                    for e in entries
                    if isinstance(e.event, WorkerEnded) and e.event.lineage == lineage
                )
                assert kill < end.position  # journaled before it was done
                assert end.event.outcome == "lost"  # type: ignore[attr-defined]
            finally:
                recovering.close()
            history = journal_history(charter.journal)
            assert check_history(history).problems == []
            assert check_workers(history).problems == []
            assert check_settled(history).problems == []
    finally:
        other.kill()
        other.wait()
        holder.release()
