"""Two `cell run` processes for one cell: exactly one acts at any time. Each
incarnation holds the cell by a journaled claim it renews; a second one waits for the
claim to lapse, or fences the first at once (``--take-over``); a fenced one starts
nothing more, kills the sandboxes it holds and stops. No worker ends twice, nothing of
theirs is left running (real sandboxes, both backends; the independent fold after)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from charter.app import Charter
from charter.audit.semantic import audit_history
from charter.control import WorkerSpec
from charter.core import KeyStore
from charter.ledger import Journal
from charter.runner.events import (
    CellClaimRenewed,
    CellStarted,
    WorkerEnded,
    WorkerKilled,
    WorkerResult,
    WorkerStarted,
)
from charter.sandbox import SandboxExited, SandboxLeased
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import alive_under, fan_out
from tests.runner.conftest import initialise

ROOT_DIR = Path(__file__).resolve().parents[2]
SLEEP = WorkerSpec(argv=("/bin/sleep", "120"))
CLAIM = "3"  # seconds: short, so a lapse is seen within the test


def _cell(url: str, home: Path, state_dir: Path, *extra: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "CHARTER_HOME": str(home),
        "PYTHONPATH": str(ROOT_DIR),
        "CHARTER_SANDBOX_STATE": str(state_dir),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", url, "--quiet", "cell", "run",
         "--ignore-host-load", "--claim", CLAIM, *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _entries(url: str, home: Path) -> list[Any]:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        return list(charter.journal.entries())


def _until(url: str, home: Path, check: Any, what: str, timeout: float = 60) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        entries = _entries(url, home)
        if check(entries):
            return entries
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _started(entries: list[Any]) -> bool:
    return any(isinstance(e.event, WorkerStarted) for e in entries)


def _one_acts_at_a_time(entries: list[Any]) -> None:
    """From the position of incarnation k+1's ``CellStarted`` on, nothing of
    incarnation k commits: no renewal, no start, and none of the facts only a cell
    appends for the workers it runs (their exits, results and ends)."""
    current = 0
    runs: dict[str, int] = {}  # sandbox -> the incarnation that started it
    sandbox_of: dict[str, str] = {}
    for e in entries:
        ev = e.event
        if isinstance(ev, CellStarted):
            assert ev.incarnation == current + 1
            current = ev.incarnation
        elif isinstance(ev, CellClaimRenewed):
            assert ev.incarnation == current, (e.position, ev)
        elif isinstance(ev, WorkerStarted):
            assert ev.incarnation == current, (e.position, ev)
            runs[ev.sandbox_id] = ev.incarnation
            sandbox_of[ev.lineage] = ev.sandbox_id
        elif isinstance(ev, SandboxExited) and ev.sandbox_id in runs:
            assert runs[ev.sandbox_id] == current, (e.position, ev)
        elif isinstance(ev, WorkerResult) and ev.lineage in sandbox_of:
            assert runs[sandbox_of[ev.lineage]] == current, (e.position, ev)


def _settled(url: str, home: Path, entries: list[Any]) -> None:
    ends = Counter(e.event.lineage for e in entries if isinstance(e.event, WorkerEnded))
    assert ends, "no worker ended"
    assert set(ends.values()) == {1}, ends  # every worker ended once
    uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}
    deadline = time.monotonic() + 10
    while alive_under(uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_under(uids) == []  # nothing of theirs is left running
    _one_acts_at_a_time(entries)
    with Charter.open(url, keys=KeyStore(home)) as charter:
        history = journal_history(charter.journal)
    assert check_history(history).problems == []
    assert check_workers(history).problems == []
    assert check_settled(history).problems == []
    # charter audit (its cell-claim, journal-allowance and worker-lifecycle rules) agrees
    with Journal.open(url) as journal:
        report = audit_history(journal.payloads())
    assert report.ok, report.findings


@pytest.mark.sandbox
@pytest.mark.parametrize("paused", [False, True], ids=["take-over", "sigstopped"])
def test_a_second_incarnation_fences_the_first_and_nothing_ends_twice(
    journal_url: str, tmp_path: Path, state_dir: Path, paused: bool
) -> None:
    """take-over: the second fences the first at once. sigstopped: the first is stopped
    (it cannot renew); the second waits for its claim to lapse, takes the cell over and
    fails its worker (``lost``); the first, resumed past its claim, finds itself fenced,
    starts nothing, kills its own sandbox and stops."""
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=2) as charter:
        (lineage,) = (
            str(c.lineage)
            for c in fan_out(charter, 1, WorkerSpec(argv=("/bin/sleep", "120"))).children
        )
    first = _cell(journal_url, home, state_dir)
    try:
        _until(journal_url, home, _started, "the first cell did not start its worker")
        if paused:
            first.send_signal(signal.SIGSTOP)
        second = _cell(
            journal_url, home, state_dir, "--once", *(() if paused else ("--take-over",))
        )
        _, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
        entries = _entries(journal_url, home)
        (ended,) = (e.event for e in entries if isinstance(e.event, WorkerEnded))
        assert ended.lineage == lineage
        # Failed by the second (lost), or, when the first's own claim lapsed first on
        # a loaded host and it stopped by itself, killed by the first: never both.
        assert ended.outcome == "lost" if paused else ended.outcome in ("lost", "killed")
        if paused:
            started = [e for e in entries if isinstance(e.event, CellStarted)]
            renewed = [
                e
                for e in entries
                if isinstance(e.event, CellClaimRenewed) and e.event.incarnation == 1
            ]
            claim = max([started[0].event.claim_until_ms, *(r.event.until_ms for r in renewed)])
            # It waited for the lapse: its start committed after the stopped one's claim.
            second_at = started[1].recorded_at.timestamp() * 1000
            assert second_at >= claim, (second_at, claim)
            first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 1, err  # it stopped, and said why
        assert "fenced" in err or "superseded" in err or "stops" in err, err
    finally:
        if first.poll() is None:
            first.kill()
    entries = _entries(journal_url, home)
    incarnations = [e.event.incarnation for e in entries if isinstance(e.event, CellStarted)]
    assert incarnations == [1, 2]
    _settled(journal_url, home, entries)


@pytest.mark.sandbox
def test_a_second_incarnation_waits_while_the_first_renews(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """While the first renews its claim, the second starts nothing (its CellStarted is
    not journaled, past several claim lengths); once the first stops (its claim ends
    with it), the second takes the cell at once and runs what is left."""
    home = tmp_path / "home"
    # One processing slot: the sleeper holds it, so the worker fanned out later waits
    # in the queue for the second (with two, the first could start it and kill it as
    # it stops, and the test would be about a race, not the hand-over).
    with initialise(journal_url, home, processing=1) as charter:
        fan_out(charter, 1, WorkerSpec(argv=("/bin/sleep", "120")))
    first = _cell(journal_url, home, state_dir)
    second: subprocess.Popen[str] | None = None
    try:
        _until(journal_url, home, _started, "the first cell did not start its worker")
        second = _cell(journal_url, home, state_dir, "--once")
        wait_until = time.monotonic() + 3 * float(CLAIM)
        while time.monotonic() < wait_until:  # the second must not start meanwhile
            assert second.poll() is None
            time.sleep(0.2)
        entries = _entries(journal_url, home)
        assert [e.event.incarnation for e in entries if isinstance(e.event, CellStarted)] == [1]
        renewals = [e for e in entries if isinstance(e.event, CellClaimRenewed)]
        assert len(renewals) >= 3  # the first kept its claim
        with initialise_later(journal_url, home) as charter:
            fan_out(charter, 1, WorkerSpec(argv=("/bin/true",)))  # queued for the second
        first.send_signal(signal.SIGTERM)  # drain: its sleeper keeps it ...
        first.send_signal(signal.SIGINT)  # ... so stop it at once (kills journaled)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        _, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    entries = _entries(journal_url, home)
    assert [e.event.incarnation for e in entries if isinstance(e.event, CellStarted)] == [1, 2]
    ends = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
    outcomes = sorted(end.outcome for end in ends)
    # the sleeper killed by the first, /bin/true ran (started by the second)
    assert outcomes == ["exited", "killed"], [(end.outcome, end.reason) for end in ends]
    starts = [e.event.incarnation for e in entries if isinstance(e.event, WorkerStarted)]
    assert starts == [1, 2], starts
    assert any(isinstance(e.event, WorkerKilled) for e in entries)
    _settled(journal_url, home, entries)


def initialise_later(url: str, home: Path) -> Charter:
    return Charter.open(url, keys=KeyStore(home))
