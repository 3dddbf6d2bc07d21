"""The cell supervises its workers (real sandboxes): a decoy credential read is a
committed quarantine verdict within 1 s naming the canary; a CPU hog among honest
workers of its class gets a verdict and the honest ones none; every baseline and verdict
in the journal is reproduced exactly by a fold from zero; the sampler keeps its interval;
the operator's policy file is read, and a bad one is bad input naming the field."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from charter.app import Charter
from charter.authority import FixedPolicy, SpawnIntent
from charter.authority import Verdict as AuthorityVerdict
from charter.control import ResourceView, SpawnResult, WorkerSpec
from charter.core import BadInputError, canonical_json
from charter.ledger import Entry, Journal
from charter.runner._supervise import (
    BURN_EVERY_S,
    POLICY_FILE,
    SAMPLE_INTERVAL_S,
    load_policy,
    profile_outcome,
)
from charter.runner._view import WorkersView
from charter.runner.cell import Cell
from charter.runner.errors import SupervisionPolicyError
from charter.runner.events import WorkerEnded, WorkerKilled, WorkerResult, WorkerStarted
from charter.runner.status import Row, cell_status, tree_rows
from charter.sandbox import SandboxExited
from charter.supervision import (
    Baseline,
    BaselineChanged,
    CanariesPlanted,
    QuarantineVerdict,
    Supervised,
    SupervisionPolicy,
    WorkerProfiled,
    WorkerSampled,
    decide,
    learn,
    supervised_after,
)
from charter.supervision import Verdict as VerdictEvent
from tests.runner._support import cli_env, fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import PRELUDE, REASON, python

VERDICTS = ("ThrottleVerdict", "PauseVerdict", "ResumeVerdict", "KillVerdict", "QuarantineVerdict")
HONEST = ("/bin/sh", "-c", "sleep 0.3")
HOG = ("/bin/sh", "-c", "while :; do :; done & while :; do :; done")  # two, on a busy host
READER = (
    "/bin/sh",
    "-c",
    "sleep 0.5; date +%s%N; cat /workspace/.charter-secrets/*.ini >/dev/null; sleep 2",
)
NEIGHBOUR = ("/bin/sh", "-c", "sleep 0.5; ls -la /workspace/.charter-secrets >/dev/null; sleep 2")


def _verdicts(journal: Journal) -> list[Entry]:
    return list(journal.entries(types=VERDICTS))


def _wait(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


def _write_policy(home: Path, **fields: object) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / POLICY_FILE).write_text(json.dumps(fields))


def replay(entries: Iterable[Entry], policy: SupervisionPolicy) -> tuple[int, int]:
    """Fold the journal from zero: every ``BaselineChanged`` must be what ``learn`` gives
    on the ``WorkerProfiled`` entries before it, and every verdict what ``decide`` (or
    the canary rule) gives on what it journals, byte for byte, on the standing every
    verdict before it on that worker left (an operator's included). Returns how many of
    each were checked."""
    baselines: dict[str, Baseline] = {}
    versions: dict[tuple[str, int], Baseline] = {}
    expected: dict[str, list[BaselineChanged]] = {}
    standing: dict[str, Supervised | None] = {}
    planted: dict[str, CanariesPlanted] = {}
    changes = verdicts = 0
    for entry in entries:
        event = entry.event
        if isinstance(event, WorkerProfiled):
            base = baselines.get(event.task_class) or Baseline.empty(event.task_class)
            change = learn(base, event)
            if change is not None:
                expected.setdefault(event.task_class, []).append(change)
                baselines[event.task_class] = Baseline.from_event(change)
        elif isinstance(event, BaselineChanged):
            want = expected[event.task_class].pop(0)
            assert canonical_json(want.payload()) == canonical_json(event.payload())
            versions[(event.task_class, event.version)] = Baseline.from_event(event)
            changes += 1
        elif isinstance(event, CanariesPlanted) and event.lineage is not None:
            planted[event.lineage] = event
        elif type(event).type_name in VERDICTS:
            v: VerdictEvent = event  # type: ignore[assignment]
            now = standing.get(v.lineage, Supervised())
            assert now is not None, "a verdict after a kill"
            canary = v.evidence[0].canary
            if v.evidence[0].signal == "operator":
                pass  # an operator's: nothing to decide again, only to fold
            elif canary is not None:  # a touch: it names one of the sandbox's own canaries
                assert isinstance(v, QuarantineVerdict)
                p = planted[v.lineage]
                assert canary in {
                    f"credential_file:{p.credential_file}",
                    f"secret_name:{p.secret_name}",
                    f"egress_destination:{p.egress_destination}",
                }
            else:
                assert v.observation is not None
                version = v.evidence[0].baseline_version
                assert version is not None
                base = versions[(v.task_class, version)]
                again = decide(
                    v.observation, base, policy, standing=now.standing, accepted=now.levels()
                )
                assert again is not None
                assert canonical_json(again.payload()) == canonical_json(v.payload())
            standing[v.lineage] = supervised_after(now, v)
            verdicts += 1
    assert not any(expected.values()), "a profile taught a baseline that was not journaled"
    return changes, verdicts


def _wide(charter: Charter, width: int, spec: WorkerSpec) -> SpawnResult:
    """A fan-out of ``width`` whose every child's lease holds a sandbox's minimum."""
    each = {"tokens": 1000, "wall_ms": 30_000, "cpu_ms": 30_000, "mem_bytes": 1 << 27}
    cost = {k: v * width for k, v in each.items()} | {"egress_bytes": 0}
    intent = SpawnIntent.model_validate(
        {"width": width, "objective": "honest workers", "estimated_cost": cost}
    )
    return charter.spawn(
        "agent:estate", intent, policy=FixedPolicy(AuthorityVerdict.POSITIVE), workers=(spec,)
    )


def _lineages(result: object) -> list[str]:
    return [str(c.lineage) for c in result.children]  # type: ignore[attr-defined]


def _ended(journal: Journal, lineages: set[str]) -> bool:
    ends = {e.event.lineage for e in journal.entries(types=("WorkerEnded",))}  # type: ignore[attr-defined]
    return lineages <= ends


@pytest.mark.sandbox
def test_a_decoy_read_is_a_quarantine_within_a_second_and_a_hog_gets_a_verdict(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """Honest workers teach their class; then a CPU hog of that class gets a verdict, a
    worker reading its decoy is quarantined (committed within 1 s of its read, the
    canary named), a worker listing the decoy's directory is not, and the honest
    workers get none. A fold of the journal from zero reproduces every baseline and
    verdict."""
    home = tmp_path / "home"
    _write_policy(home, version=7, min_completed=10)
    policy = load_policy(home)
    with initialise(journal_url, home, processing=3) as charter:
        cell = make_cell(charter, None, state_dir)
        with running(cell):
            honest = _lineages(fan_out(charter, 12, WorkerSpec(argv=HONEST, task_class="t")))
            _wait("the honest workers' ends", lambda: _ended(charter.journal, set(honest)), 120)
            hog, reader, _neighbour = _lineages(
                fan_out(
                    charter, 3, WorkerSpec(argv=HOG, task_class="t"),
                    WorkerSpec(argv=READER, task_class="reader"),
                    WorkerSpec(argv=NEIGHBOUR, task_class="reader"),
                )
            )  # fmt: skip
            on = lambda x: [e for e in _verdicts(charter.journal) if e.event.lineage == x]  # noqa: E731
            _wait("the hog's verdict", lambda: on(hog), 120)
            _wait("the reader's quarantine", lambda: on(reader), 30)
            cell.kill(hog, "the test is done with it")
            until_idle(cell, 60)
        entries = list(charter.journal.entries())
    verdicts = [e for e in entries if type(e.event).type_name in VERDICTS]
    assert {e.event.lineage for e in verdicts} == {hog, reader}  # none on the honest
    hog_verdict = next(e.event for e in verdicts if e.event.lineage == hog)
    assert hog_verdict.task_class == "t"
    assert {ev.signal for ev in hog_verdict.evidence} <= {"cpu_permille", "cpu_ms"}
    assert all(ev.policy_version == 7 for ev in hog_verdict.evidence)
    quarantine = next(e for e in verdicts if e.event.lineage == reader)
    assert isinstance(quarantine.event, QuarantineVerdict)
    planted = next(
        e.event
        for e in entries
        if isinstance(e.event, CanariesPlanted) and e.event.lineage == reader
    )
    assert quarantine.event.evidence[0].canary == f"credential_file:{planted.credential_file}"
    result = next(
        e.event for e in entries if isinstance(e.event, WorkerResult) and e.event.lineage == reader
    )
    read_at = int(result.text.split()[0]) / 1e9  # printed just before the read
    latency = quarantine.recorded_at.timestamp() - read_at
    assert 0 <= latency <= 1.0, latency
    # Every started worker had its canaries journaled in its start's append.
    started = {e.event.lineage: e.batch for e in entries if isinstance(e.event, WorkerStarted)}
    canaries = {e.event.lineage: e.batch for e in entries if isinstance(e.event, CanariesPlanted)}
    assert canaries == started
    # Profiles: completed is exited with code 0; the hog's (killed) teaches nothing.
    profiles = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerProfiled)}
    assert {profiles[x].outcome for x in honest} == {"completed"}
    assert profiles[hog].outcome == "killed"
    # The cell acts on the committed quarantine: the reader is killed, after its verdict.
    kill = next(
        e for e in entries if isinstance(e.event, WorkerKilled) and e.event.lineage == reader
    )
    assert kill.position > quarantine.position
    ends = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
    assert ends[reader].outcome == "killed"
    assert kill.recorded_at.timestamp() - read_at <= 1.0  # touch to kill within 1 s
    changes, checked = replay(entries, policy)
    assert changes == 12 + 1  # the honest twelve, then the neighbour (the reader was killed)
    assert checked == len(verdicts)


@pytest.mark.sandbox
def test_100_honest_workers_of_one_class_get_no_verdict(tmp_path: Path, state_dir: Path) -> None:
    """Zero false positives under the default policy: 100 honest workers of one class
    (the first 20 teach it, the other 80 are decided on every sample), then a CPU hog
    of the same class, which is the only worker given a verdict (the control)."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    with initialise(url, tmp_path / "home", processing=3) as charter:
        cell = make_cell(charter, None, state_dir)
        with running(cell):
            honest = _lineages(_wide(charter, 100, WorkerSpec(argv=HONEST, task_class="h")))
            _wait("the honest workers' ends", lambda: _ended(charter.journal, set(honest)), 300)
            assert not _verdicts(charter.journal)
            (hog,) = _lineages(fan_out(charter, 1, WorkerSpec(argv=HOG, task_class="h")))
            _wait("the hog's verdict", lambda: _verdicts(charter.journal), 120)
            cell.kill(hog, "the test is done with it")
            until_idle(cell, 60)
        entries = list(charter.journal.entries())
    assert {e.event.lineage for e in entries if type(e.event).type_name in VERDICTS} == {hog}
    ends = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
    assert sum(1 for x in ends if x.outcome == "exited" and x.exit_code == 0) == 100
    changes, _ = replay(entries, SupervisionPolicy())
    assert changes == 100


@pytest.mark.sandbox
def test_each_live_worker_is_sampled_every_interval(tmp_path: Path, state_dir: Path) -> None:
    """Four workers live at once for 3 s: the one sampler thread samples each of them at
    least every SAMPLE_INTERVAL_S plus a pass (bounded by twice the interval here)."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    with initialise(url, tmp_path / "home", processing=4) as charter:
        cell = make_cell(charter, None, state_dir)
        sleeper = WorkerSpec(argv=("/bin/sleep", "3"))
        with running(cell):
            lineages = _lineages(fan_out(charter, 4, sleeper))
            sup = cell.supervisor
            assert sup is not None
            seen: dict[str, list[float]] = {x: [] for x in lineages}
            live = []
            while not _ended(charter.journal, set(lineages)):
                for x in lineages:
                    times = sup.sample_times(x)
                    if len(times) > len(seen[x]):
                        seen[x] = times
                        live.append(sup.observation(x))
                time.sleep(0.05)
            until_idle(cell, 60)
    assert all(len(t) >= 8 for t in seen.values()), {x: len(t) for x, t in seen.items()}
    assert all(o is not None and o.wall_ms > 0 for o in live)  # the live sample
    gaps = [b - a for t in seen.values() for a, b in itertools.pairwise(t)]
    assert gaps
    assert max(gaps) <= 2 * SAMPLE_INTERVAL_S, max(gaps)
    # Not oversampled either: a late pass makes the next start at once, but on average
    # the sampler keeps its interval.
    assert sum(gaps) / len(gaps) >= SAMPLE_INTERVAL_S * 0.8


def test_the_policy_file(tmp_path: Path) -> None:
    """Absent: the documented defaults. Present: what it says. Bad: bad input (exit 2)
    naming the field."""
    assert load_policy(tmp_path) == SupervisionPolicy()
    _write_policy(tmp_path, version=3, min_completed=5)
    assert load_policy(tmp_path).min_completed == 5
    _write_policy(tmp_path, min_completed=0)
    with pytest.raises(SupervisionPolicyError, match="min_completed") as bad:
        load_policy(tmp_path)
    assert isinstance(bad.value, BadInputError)  # the CLI maps it to exit 2
    _write_policy(tmp_path, rules=[{"signal": "cpu_ms", "action": "kill", "factor_permille": 5}])
    with pytest.raises(SupervisionPolicyError, match=r"rules\.0\.factor_permille"):
        load_policy(tmp_path)
    _write_policy(tmp_path, verison=2)
    with pytest.raises(SupervisionPolicyError, match="verison"):
        load_policy(tmp_path)


def test_a_bad_policy_file_stops_the_cell_before_it_starts(tmp_path: Path, state_dir: Path) -> None:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    home = tmp_path / "home"
    with initialise(url, home) as charter:
        _write_policy(home, throttle_permille="lots")
        cell: Cell = make_cell(charter, None, state_dir)
        with pytest.raises(SupervisionPolicyError, match="throttle_permille"):
            cell.open()
        assert not list(charter.journal.entries(types=("CellStarted",)))


def test_completed_is_exited_with_code_zero() -> None:
    assert profile_outcome("exited", 0) == "completed"
    assert profile_outcome("exited", 1) == "exited"
    assert profile_outcome("killed", None) == "killed"


@pytest.mark.sandbox
def test_a_running_workers_burn_is_shown_while_it_runs(tmp_path: Path, state_dir: Path) -> None:
    """A worker burning CPU for 5 s: ``cell status`` (a fresh fold of the journal, as
    the CLI reads it) shows its CPU so far while it runs, not 0 until its end; the
    journal holds at most one WorkerSampled per BURN_EVERY_S of its life."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    busy = ("/bin/sh", "-c", "end=$(($(date +%s) + 5)); while [ $(date +%s) -lt $end ]; do :; done")
    with initialise(url, tmp_path / "home", processing=1) as charter:
        cell = make_cell(charter, None, state_dir)
        with running(cell):
            (lineage,) = _lineages(fan_out(charter, 1, WorkerSpec(argv=busy)))

            def live_row() -> Row | None:
                rows = cell_status(charter.journal, cell.cell).workers
                row = next(r for r in rows if r.lineage == lineage)
                return row if row.status == "running" and "so far" in row.burn else None

            _wait("a live burn", live_row, 30)
            row = live_row()
            assert row is not None
            cpu_s = float(row.burn.split()[1].removesuffix("s"))
            assert cpu_s > 0.05, row.burn  # not 0 until its end (a share of a loaded host)
            until_idle(cell, 60)
        entries = list(charter.journal.entries())
        view, resources = WorkersView(), ResourceView()
        view.refresh(charter.journal)
        resources.refresh(charter.journal)
        (final,) = tree_rows(view, resources, cell.cell)
    assert final.status == "exited"
    assert final.burn.startswith("cpu "), final  # its end's charge, its lease ended
    assert "so far" not in final.burn  # its end's charge, now
    samples = [e.event for e in entries if isinstance(e.event, WorkerSampled)]
    exited = next(e.event for e in entries if isinstance(e.event, SandboxExited))
    assert 1 <= len(samples) <= exited.usage.wall_ms / 1000 / BURN_EVERY_S


@pytest.mark.sandbox
def test_the_demo_gets_no_verdict(tmp_path: Path) -> None:
    """``charter demo`` in a fresh home, supervised (every sandbox had its canaries,
    every worker's profile was journaled): not one verdict."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in {"CHARTER_HOME", "CHARTER_DB"}}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--json", "demo", "--home", str(home)],
        env=env, capture_output=True, timeout=600, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    with Journal.open(f"sqlite:///{home / 'journal.db'}") as journal:
        entries = list(journal.entries())
    started = [e for e in entries if isinstance(e.event, WorkerStarted)]
    kinds = [type(e.event).type_name for e in entries]
    assert len(started) > 3
    assert kinds.count("CanariesPlanted") == len(started)
    assert kinds.count("WorkerProfiled") == len(started)
    assert not [k for k in kinds if k in VERDICTS]


SECRET_ASKER = (
    PRELUDE
    + REASON
    + """
import os
door = charter_door.Door()
asked = [reason(lambda: door.secret("db-password"))]
# The decoy's name from its file's name: listing the directory opens no decoy.
(name,) = os.listdir("/workspace/.charter-secrets")
if sys.argv[1] == "decoy":
    short = name.removeprefix("deploy-").removesuffix(".ini")
    asked.append(reason(lambda: door.secret("deploy-key-" + short)))
door.result(json.dumps(asked))
"""
)


@pytest.mark.sandbox
def test_the_doors_secret_call_refuses_every_name_and_the_decoy_is_a_touch(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """Every name is refused (``secret-not-held``, SecretNotHeldError at the door); asking
    for its own sandbox's decoy name is a quarantine naming it (and the cell kills it),
    asking for another name is not (the control)."""
    with initialise(journal_url, tmp_path / "home", processing=2) as charter:
        result = fan_out(charter, 2, python(SECRET_ASKER, "decoy"), python(SECRET_ASKER, "control"))
        asker, control = _lineages(result)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell, 120)
        entries = list(charter.journal.entries())
    results = {e.event.lineage: e.event.text for e in entries if isinstance(e.event, WorkerResult)}
    assert json.loads(results[control]) == ["secret-not-held"]  # SecretNotHeldError
    # The asker is quarantined, then killed by the cell acting on that verdict (its
    # answer may never come): any answer it gave is the same refusal.
    assert json.loads(results.get(asker, "[]")) in ([], ["secret-not-held"] * 2)
    ends = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
    assert ends[asker].outcome == "killed"
    assert ends[control].outcome == "exited"
    verdicts = [e.event for e in entries if type(e.event).type_name in VERDICTS]
    assert [v.lineage for v in verdicts] == [asker]
    planted = next(
        e.event
        for e in entries
        if isinstance(e.event, CanariesPlanted) and e.event.lineage == asker
    )
    assert verdicts[0].evidence[0].canary == f"secret_name:{planted.secret_name}"
    replay(entries, SupervisionPolicy())


def test_charter_cell_run_with_a_bad_policy_file_is_exit_2_naming_the_field(
    tmp_path: Path, state_dir: Path
) -> None:
    """The real CLI: ``charter cell run`` with a bad ``supervision.json`` exits 2 naming
    the field; with the file fixed it runs (the control)."""
    home = tmp_path / "home"
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    env = {**cli_env(home, state_dir)}

    def charter_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "charter", "--db", url, *args],
            env=env, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip

    budget = "tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=0"
    assert charter_cli("init", "--root", "estate", "--budget", budget).returncode == 0
    _write_policy(home, rules=[{"signal": "cpu_ms", "action": "kill", "factor_permille": 5}])
    bad = charter_cli("cell", "run", "--once", "--ignore-host-load")
    assert bad.returncode == 2, bad.stderr
    assert "rules.0.factor_permille" in bad.stderr
    _write_policy(home, min_completed=3)
    good = charter_cli("cell", "run", "--once", "--ignore-host-load")
    assert good.returncode == 0, good.stderr
