"""A delegate lives only while its caller waits for it (docs/delegation.md), in real
sandboxes on both backends: killing the caller kills it; a caller that closes its
connection (stops waiting, lives on) has it killed; a cell restart fails it as it fails
every worker of the dead incarnation; a host whose isolation probe fails starts no
delegate. Each with its positive control, the audit and the independent fold after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from charter.app import Charter
from charter.audit.semantic import audit_history
from charter.control import DelegationReplied, DelegationRequested, WorkerKilled
from charter.core import KeyStore
from charter.ledger import Journal
from charter.runner import Cell
from charter.runner.events import WorkerEnded, WorkerResult, WorkerStarted
from charter.sandbox.events import SandboxLeased
from tests.runner._delegate_support import (
    HANGER,
    SLEEPER,
    SLOT,
    WAITER,
    FlagServer,
    folds_clean,
    own_agent,
    spawn_caller,
)
from tests.runner._support import alive_under, make_cell, running, until_idle
from tests.runner.conftest import initialise

WT = Path(__file__).resolve().parents[2]


@pytest.fixture
def flag() -> FlagServer:
    s = FlagServer()
    yield s  # type: ignore[misc]
    s.close()


def _sleeper_estate(url: str, home: Path, flag: FlagServer, source: str) -> tuple[Charter, str]:
    where = f"127.0.0.1:{flag.port}"
    charter = initialise(url, home, egress=frozenset({where}))
    own_agent(charter, "sleeper", SLEEPER, egress=frozenset({where}))
    caller = spawn_caller(charter, source, flag.url, egress=[where])
    return charter, caller


@contextmanager
def _delegating(
    url: str, tmp_path: Path, state_dir: Path, flag: FlagServer, source: str
) -> Iterator[tuple[Charter, Cell]]:
    """A caller running ``source`` on a cell, once its sleeper delegate has started."""
    charter, _ = _sleeper_estate(url, tmp_path / "home", flag, source)
    with charter, running(make_cell(charter, None, state_dir, door=True, budget=SLOT)) as cell:
        assert flag.started.wait(120), "the delegate started and reached its own server"
        yield charter, cell


def _pair(journal: Journal) -> tuple[str, str]:
    """The one delegation's caller and delegate."""
    (d,) = [e.event for e in journal.entries() if isinstance(e.event, DelegationRequested)]
    return d.caller, d.delegate


def _ends(journal: Journal) -> dict[str, tuple[int, WorkerEnded]]:
    return {
        e.event.lineage: (e.position, e.event)
        for e in journal.entries()
        if isinstance(e.event, WorkerEnded)
    }


def _uid_of(journal: Journal, lineage: str) -> int:
    leases = [e.event for e in journal.entries() if isinstance(e.event, SandboxLeased)]
    (leased,) = [x for x in leases if str(x.lineage) == lineage]
    return leased.host_uid


def _kill_of(journal: Journal, lineage: str) -> WorkerKilled:
    kills = [e.event for e in journal.entries() if isinstance(e.event, WorkerKilled)]
    (kill,) = [k for k in kills if k.lineage == lineage]
    return kill


def _clean(journal: Journal) -> None:
    findings = audit_history(journal.payloads()).findings
    assert findings == (), findings
    folds_clean(journal)


@pytest.mark.sandbox
def test_killing_the_caller_kills_its_delegate(
    journal_url: str, tmp_path: Path, state_dir: Path, flag: FlagServer
) -> None:
    with _delegating(journal_url, tmp_path, state_dir, flag, WAITER) as (charter, cell):
        caller, delegate = _pair(charter.journal)
        uid = _uid_of(charter.journal, delegate)
        assert alive_under({uid}), "positive control: the delegate runs"
        charter.verdict(caller, "kill", reason="the test kills the caller")
        until_idle(cell, timeout=120)
        ends = _ends(charter.journal)
        assert ends[caller][1].outcome == "killed"
        assert ends[delegate][1].outcome == "killed"
        # It ended first: what it used is charged while its caller's lease is live.
        assert ends[delegate][0] < ends[caller][0]
        assert caller in _kill_of(charter.journal, delegate).reason
        assert alive_under({uid}) == []
        assert not any(isinstance(e.event, DelegationReplied) for e in charter.journal.entries())
        _clean(charter.journal)


@pytest.mark.sandbox
def test_a_caller_that_stops_waiting_has_its_delegate_killed(
    journal_url: str, tmp_path: Path, state_dir: Path, flag: FlagServer
) -> None:
    with _delegating(journal_url, tmp_path, state_dir, flag, HANGER) as (charter, cell):
        caller, delegate = _pair(charter.journal)
        deadline = time.monotonic() + 60
        while delegate not in _ends(charter.journal):  # the caller closed its connection
            assert time.monotonic() < deadline, "the delegate outlived its caller's wait"
            time.sleep(0.05)
        assert caller not in _ends(charter.journal), "the caller lives on"
        flag.state = "gone"  # now the caller may answer and end
        until_idle(cell, timeout=120)
        ends = _ends(charter.journal)
        assert ends[delegate][1].outcome == "killed"
        assert ends[caller][1].outcome == "exited"  # it stopped waiting; it did not end
        reason = _kill_of(charter.journal, delegate).reason
        assert reason == f"{caller} stopped waiting (its connection closed)"
        results = {e.event.lineage: e.event.text for e in charter.journal.entries()
                   if isinstance(e.event, WorkerResult)}  # fmt: skip
        assert results[caller] == "closed"
        _clean(charter.journal)


def _cell(url: str, home: Path, state: Path, **env: str) -> subprocess.Popen[bytes]:
    environ = {**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": str(WT),
               "CHARTER_SANDBOX_STATE": str(state), **env}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", url, "--quiet", "cell", "run", "--once",
         "--ignore-host-load"],
        env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.sandbox
def test_a_cell_restart_fails_the_delegate(
    journal_url: str, tmp_path: Path, state_dir: Path, flag: FlagServer
) -> None:
    home = tmp_path / "home"
    charter, caller = _sleeper_estate(journal_url, home, flag, WAITER)
    charter.close()
    first = _cell(journal_url, home, state_dir)
    try:
        assert flag.started.wait(120), "the delegate started under the first incarnation"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    with Charter.open(journal_url, keys=KeyStore(home)) as charter:
        assert _pair(charter.journal)[0] == caller
        delegate = _pair(charter.journal)[1]
        started = [e.event for e in charter.journal.entries() if isinstance(e.event, WorkerStarted)]
        assert {s.lineage for s in started} == {caller, delegate}  # positive control
        uid = _uid_of(charter.journal, delegate)
    second = _cell(journal_url, home, state_dir)
    _, err = second.communicate(timeout=180)
    assert second.returncode == 0, err
    with Charter.open(journal_url, keys=KeyStore(home)) as charter:
        ends = _ends(charter.journal)
        assert ends[delegate][1].outcome == "lost"
        assert ends[caller][1].outcome == "lost"
        assert "took over" in ends[delegate][1].reason
        assert alive_under({uid}) == []
        assert not any(isinstance(e.event, DelegationReplied) for e in charter.journal.entries())
        _clean(charter.journal)


@pytest.mark.sandbox
def test_no_delegate_starts_on_a_host_whose_probe_fails(
    tmp_path: Path, state_dir: Path, flag: FlagServer
) -> None:
    home, url = tmp_path / "home", f"sqlite:///{tmp_path}/journal.db"
    charter, _ = _sleeper_estate(url, home, flag, WAITER)
    charter.close()
    fresh = tmp_path / "state"  # no pass on record: the probe runs, and fails
    fresh.mkdir(mode=0o755)
    refused = _cell(url, home, fresh, PATH="/nonexistent", CHARTER_BWRAP="")
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 4, err
    with Journal.open(url) as journal:
        kinds = [e.type_name for e in journal.entries()]
    assert "SandboxProbeRefused" in kinds
    assert "WorkerStarted" not in kinds
    assert "DelegationRequested" not in kinds
    # Positive control: on a host that isolates, the same caller delegates.
    ran = _cell(url, home, state_dir)
    try:
        assert flag.started.wait(120), "the delegate started where the probe passes"
    finally:
        ran.send_signal(signal.SIGKILL)
        ran.wait(30)
    with Journal.open(url) as journal:
        assert any(isinstance(e.event, DelegationRequested) for e in journal.entries())
