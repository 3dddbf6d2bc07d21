"""The cell carries out every committed verdict, whoever appended it: each verdict here
is appended by another process (`charter verdict`, a subprocess) while the cell runs
real sandboxes (both backends), and each test shows the act beside what the worker did
before it (throttle: its CPU rate drops; pause: its counter stops, and counts on after
the resume; kill: it would have completed, its end says killed; quarantine: its
workspace's digest is journaled before the kill, its subtree is revoked, a queued
descendant never starts and a mint under it is refused). The independent fold after."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from charter.app import Charter
from charter.authority import LineageRevoked
from charter.core import Budget, KeyStore
from charter.runner import Cell
from charter.runner.events import WorkerEnded, WorkerKilled, WorkerStarted
from charter.sandbox import (
    SandboxControl,
    SandboxExited,
    SandboxLeased,
    SandboxQuarantined,
    SandboxSpec,
    sample_signals,
    sandbox_pid,
)
from charter.supervision import KillVerdict, QuarantineVerdict, WorkspaceDigested
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import (
    alive_under,
    cli_env,
    fan_out,
    make_cell,
    mint_below_is_refused,
    running,
    until_idle,
)
from tests.runner._watching import spec_of, until
from tests.runner.conftest import SLOT_BUDGET, initialise
from tests.runner.programs import PRELUDE, PY, python

SPIN = "while True:\n    pass\n"
COUNT = (
    "import time\n"
    "i = 0\n"
    "while True:\n"
    "    i += 1\n"
    "    open('/workspace/n.tmp', 'w').write(str(i))\n"
    "    import os; os.replace('/workspace/n.tmp', '/workspace/n')\n"
    "    time.sleep(0.01)\n"
)


def _verdict(home: Path, state_dir: Path, url: str, lineage: str, *args: str) -> int:
    """``charter verdict LINEAGE ARGS...`` in another process; the position it appended."""
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, "--json", "verdict", lineage, *args],
        env=cli_env(home, state_dir), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["position"])


def _started(charter: Charter, lineage: str) -> bool:
    return any(
        isinstance(e.event, WorkerStarted) and e.event.lineage == lineage
        for e in charter.journal.entries(types=("WorkerStarted",))
    )


def _cpu_rate(spec, window: float = 1.0) -> float:  # type: ignore[no-untyped-def]
    """The sandbox's CPU use over ``window`` seconds, in cores."""
    before, t0 = sample_signals(spec).cpu_ms, time.monotonic()
    time.sleep(window)
    return (sample_signals(spec).cpu_ms - before) / 1000 / (time.monotonic() - t0)


def _best_rate(spec, above: float, tries: int = 8) -> float:  # type: ignore[no-untyped-def]
    """The highest of up to ``tries`` one-second rates, stopping once one is ``above``."""
    best = 0.0
    for _ in range(tries):
        best = max(best, _cpu_rate(spec))
        if best > above:
            break
    return best


def _count(spec) -> int:  # type: ignore[no-untyped-def]
    pid = sandbox_pid(spec)
    assert pid is not None
    try:
        return int(Path(f"/proc/{pid}/root/workspace/n").read_text() or 0)
    except FileNotFoundError:
        return 0


def _clean(charter: Charter) -> None:
    history = journal_history(charter.journal)
    assert check_history(history).problems == []
    assert check_workers(history).problems == []
    assert check_settled(history).problems == []


@dataclass
class _Run:
    """One worker running in a cell, and a way to append verdicts on it from a CLI."""

    charter: Charter
    cell: Cell
    lineage: str
    spec: SandboxSpec
    say: Callable[..., int]


@contextmanager
def _one_worker(
    url: str, tmp_path: Path, state_dir: Path, source: str, budget: Budget = SLOT_BUDGET
) -> Iterator[_Run]:
    """``source`` as the one worker of a fan-out, started by a cell; the independent
    fold is checked on the journal once the block ends."""
    home = tmp_path / "home"
    with initialise(url, home, processing=1) as charter:
        (child,) = fan_out(charter, 1, python(source)).children
        lineage = str(child.lineage)
        with running(make_cell(charter, None, state_dir, budget=budget)) as cell:
            spec = spec_of(cell, lineage)
            say = functools.partial(_verdict, home, state_dir, url, lineage)
            yield _Run(charter, cell, lineage, spec, say)
        _clean(charter)


@pytest.mark.sandbox
def test_a_throttle_from_another_process_lowers_the_cpu_rate_and_resume_restores_it(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with _one_worker(journal_url, tmp_path, state_dir, SPIN) as run:
        spec, control = run.spec, SandboxControl(run.spec)
        # On a shared host one second may get little CPU: the best of a few.
        before = _best_rate(spec, above=0.25)
        assert before > 0.25  # the control: unthrottled, it runs well above the quota
        run.say("throttle", "--quota", "100", "--reason", "a hog")
        until("the throttle", lambda: control.cpu_quota_us() < spec.cpu_quota_us)
        assert control.cpu_quota_us() == spec.cpu_period_us // 10
        throttled = max(_cpu_rate(spec) for _ in range(3))
        assert throttled < 0.15  # a tenth of a core, and a little scheduling slack
        run.say("resume")
        until("the restore", lambda: control.cpu_quota_us() == spec.cpu_quota_us)
        assert _best_rate(spec, above=0.25) > 0.25


@pytest.mark.sandbox
def test_a_pause_from_another_process_stops_the_counter_and_resume_lets_it_count_on(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with _one_worker(journal_url, tmp_path, state_dir, COUNT) as run:
        spec, control = run.spec, SandboxControl(run.spec)
        until("the counter counting", lambda: _count(spec) > 5)
        first = _count(spec)
        time.sleep(0.3)
        assert _count(spec) > first  # the control: it counts while not paused
        run.say("pause", "--reason", "hold on")
        until("the pause", control.frozen)
        stopped = _count(spec)
        time.sleep(0.5)
        assert _count(spec) == stopped  # frozen: not one more count
        run.say("resume")
        until("the thaw", lambda: not control.frozen())
        until("the counter counting on", lambda: _count(spec) > stopped + 5, 10)


@pytest.mark.sandbox
def test_a_kill_verdict_from_another_process_kills_a_worker_that_would_complete(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=1) as charter:
        (child,) = fan_out(charter, 1, python("import time; time.sleep(8)")).children
        lineage = str(child.lineage)
        began = time.monotonic()
        with running(make_cell(charter, None, state_dir)) as cell:
            spec_of(cell, lineage)
            at = _verdict(home, state_dir, journal_url, lineage, "kill", "--reason", "stop it")
            until_idle(cell, 30)
            took = time.monotonic() - began
            # A verdict on a worker that has ended is nothing (never an error).
            late = _verdict(home, state_dir, journal_url, lineage, "kill")
            cell.step()
        assert took < 8  # it did not run to completion
        entries = list(charter.journal.entries())
        (verdict,) = [e for e in entries if isinstance(e.event, KillVerdict) and e.position == at]
        (killed,) = [e for e in entries if isinstance(e.event, WorkerKilled)]
        (exited,) = [e for e in entries if isinstance(e.event, SandboxExited)]
        (ended,) = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
        assert verdict.position < killed.position < exited.position  # committed, then done
        assert late > ended_position(entries)
        assert ended.outcome == "killed"
        assert ended.reason.startswith("kill verdict (by ")
        assert "stop it" in ended.reason
        _clean(charter)


def ended_position(entries: list) -> int:  # type: ignore[type-arg]
    return max(e.position for e in entries if isinstance(e.event, WorkerEnded))


@pytest.mark.sandbox
def test_a_kill_verdict_is_the_control_for_the_worker_that_completes(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """The same worker with no verdict completes (so the kill above is the verdict's)."""
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        fan_out(charter, 1, python("import time; time.sleep(2)"))
        with running(make_cell(charter, None, state_dir)) as cell:
            until_idle(cell, 60)
        (ended,) = [e.event for e in charter.journal.entries() if isinstance(e.event, WorkerEnded)]
        assert ended.outcome == "exited"


# Writes evidence into its workspace, spawns two sleeping children (the cell's one
# processing slot takes one; the other queues) and waits on them.
PARENT = (
    PRELUDE
    + f"""
open('/workspace/evidence.txt', 'w').write('what the worker left')
door = charter_door.Door()
kids = door.spawn({{"width": 2, "objective": "two sleeping children to wait on",
                   "estimated_cost": {{"tokens": 10_000, "wall_ms": 60_000, "cpu_ms": 60_000,
                                      "mem_bytes": 1 << 28, "egress_bytes": 0}}}},
                  [{{"argv": ["{PY}", "-I", "-c", "import time; time.sleep(600)"]}},
                   {{"argv": ["{PY}", "-I", "-c", "import time; time.sleep(600)"]}}])["children"]
door.wait(kids, 600)
"""
)


@pytest.mark.sandbox
def test_a_quarantine_from_another_process_digests_kills_and_revokes_the_subtree(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=1, coordination=1) as charter:
        (top,) = fan_out(charter, 1, python(PARENT), fanout=4, depth=2).children
        lineage = str(top.lineage)
        kids = [f"{lineage}/sa-1", f"{lineage}/sa-2"]
        cell = make_cell(charter, None, state_dir, door=True)
        with running(cell):
            until("a child running", lambda: any(_started(charter, k) for k in kids), 90)
            at = _verdict(home, state_dir, journal_url, lineage, "quarantine", "--reason", "x")
            until_idle(cell, 30)
        entries = list(charter.journal.entries())
        (verdict,) = [e for e in entries if isinstance(e.event, QuarantineVerdict)]
        assert verdict.position == at
        (digested,) = [e for e in entries if isinstance(e.event, WorkspaceDigested)]
        assert digested.event.digest is not None
        assert digested.event.files >= 2
        (revoked,) = [e for e in entries if isinstance(e.event, LineageRevoked)]
        assert str(revoked.event.lineage) == lineage
        kills = {e.event.lineage: e.position for e in entries if isinstance(e.event, WorkerKilled)}
        exits = [e.position for e in entries if isinstance(e.event, SandboxExited)]
        # Committed, then frozen and digested, then killed: the digest before every kill.
        assert verdict.position < digested.position <= kills[lineage] < min(exits)
        assert set(kills) == {lineage, *kids}
        ends = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        assert {x: ends[x].outcome for x in (lineage, *kids)} == dict.fromkeys(
            (lineage, *kids), "killed"
        )
        assert ends[lineage].reason.startswith("quarantine verdict")
        started = [k for k in kids if _started(charter, k)]
        assert len(started) == 1  # the queued one never started
        starts = [e.position for e in entries if isinstance(e.event, WorkerStarted)]
        assert max(starts) < revoked.position
        quarantined = [e.event for e in entries if isinstance(e.event, SandboxQuarantined)]
        assert [q.sandbox_id for q in quarantined] == [ends[lineage].sandbox_id]
        uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}
        assert alive_under(uids) == []
        mint_below_is_refused(charter, top)  # a mint under it loses; beside it, made
        _clean(charter)
        # The auditor's semantic checks agree (a quarantined sandbox's end included).
        audit = subprocess.run(
            [sys.executable, "-m", "charter", "--db", journal_url, "--json", "audit"],
            env=cli_env(home, state_dir), capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert audit.returncode == 0, audit.stdout[-3000:]


@pytest.mark.sandbox
def test_a_paused_worker_is_killed_at_once_by_a_kill_verdict(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """A frozen sandbox dies only once thawed: the freeze-then-kill thaws after its
    SIGKILLs, so a paused worker's kill is as quick as any (no process of it is left)."""
    with _one_worker(journal_url, tmp_path, state_dir, COUNT) as run:
        run.say("pause")
        until("the pause", SandboxControl(run.spec).frozen)
        began = time.monotonic()
        run.say("kill", "--reason", "paused, then")
        until_idle(run.cell, 30)
        took = time.monotonic() - began
        entries = list(run.charter.journal.entries())
    assert took < 5  # not the 60 s wall clock; not a kill that spins on frozen tasks
    (ended,) = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
    assert ended.outcome == "killed"
    assert ended.reason.startswith("kill verdict")
    uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}
    assert alive_under(uids) == []


@pytest.mark.sandbox
def test_a_paused_workers_wall_clock_still_runs_in_the_cell(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """Paused at once, a worker whose wall clock is 4 s still ends at its wall clock
    (timed_out), frozen all the while: a pause never stretches its lease."""
    short = Budget.parse("tokens=0,wall=4s,cpu=60s,mem=256MiB,egress=0MB")
    with _one_worker(journal_url, tmp_path, state_dir, COUNT, budget=short) as run:
        run.say("pause")
        until("the pause", SandboxControl(run.spec).frozen)
        until_idle(run.cell, 30)
        entries = list(run.charter.journal.entries())
    (ended,) = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
    assert ended.outcome == "timed_out"


def test_a_verdict_on_a_worker_that_never_started_is_refused_and_journals_nothing(
    sqlite_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with initialise(sqlite_url, home, processing=1) as charter:
        (child,) = fan_out(charter, 1, python(SPIN)).children
        head = charter.journal.head()
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--db", sqlite_url, "verdict", str(child.lineage),
         "pause"],
        env=cli_env(home, state_dir), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "no started worker" in done.stderr
    with Charter.open(sqlite_url, keys=KeyStore(home)) as again:
        assert again.journal.head() == head  # nothing appended
    quota = subprocess.run(
        [sys.executable, "-m", "charter", "--db", sqlite_url, "verdict", str(child.lineage),
         "pause", "--quota", "5"],
        env=cli_env(home, state_dir), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert quota.returncode == 2  # --quota is for throttle only
