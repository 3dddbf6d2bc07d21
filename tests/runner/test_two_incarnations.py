"""Two `cell run` processes for one cell: only the newest incarnation acts. The second
one fails the first one's running worker (kill journaled first, its sandbox left alone:
the first still holds its uid); the first sees that it was superseded, starts nothing
more, kills the sandboxes it holds and stops. No worker ends twice, nothing of theirs
is left running (real sandboxes, both backends)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from charter.app import Charter
from charter.control import WorkerSpec
from charter.core import KeyStore
from charter.runner.events import CellStarted, WorkerEnded, WorkerStarted
from charter.sandbox import SandboxLeased
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import alive_under, fan_out
from tests.runner.conftest import initialise

ROOT_DIR = Path(__file__).resolve().parents[2]


def _cell(url: str, home: Path, state_dir: Path, *extra: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "CHARTER_HOME": str(home),
        "PYTHONPATH": str(ROOT_DIR),
        "CHARTER_SANDBOX_STATE": str(state_dir),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", url, "--quiet", "cell", "run",
         "--ignore-host-load", *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _entries(url: str, home: Path) -> list[object]:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        return list(charter.journal.entries())


@pytest.mark.sandbox
@pytest.mark.parametrize("paused", [False, True], ids=["running", "sigstopped"])
def test_a_second_incarnation_supersedes_the_first_and_nothing_ends_twice(
    journal_url: str, tmp_path: Path, state_dir: Path, paused: bool
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=2) as charter:
        fan_out(charter, 1, WorkerSpec(argv=("/bin/sleep", "120")))
    first = _cell(journal_url, home, state_dir)
    try:
        deadline = time.monotonic() + 60
        while not any(isinstance(e.event, WorkerStarted) for e in _entries(journal_url, home)):  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the first cell did not start its worker"
            time.sleep(0.1)
        if paused:  # stopped past the takeover, resumed after it
            first.send_signal(signal.SIGSTOP)
        second = _cell(journal_url, home, state_dir, "--once")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
        if paused:
            first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 1  # it stopped, and said why
        assert "superseded" in err or "stops" in err, err
    finally:
        if first.poll() is None:
            first.kill()
    entries = _entries(journal_url, home)
    incarnations = [e.event.incarnation for e in entries if isinstance(e.event, CellStarted)]  # type: ignore[attr-defined]
    assert incarnations == [1, 2]
    ends = Counter(e.event.lineage for e in entries if isinstance(e.event, WorkerEnded))  # type: ignore[attr-defined]
    assert list(ends.values()) == [1]  # the worker ended once
    uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while alive_under(uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_under(uids) == []  # the first killed its own sandbox as it stopped
    with Charter.open(journal_url, keys=KeyStore(home)) as charter:
        history = journal_history(charter.journal)
    assert check_history(history).problems == []
    assert check_workers(history).problems == []
    assert check_settled(history).problems == []
