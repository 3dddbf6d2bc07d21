"""One composition root: every face (CLI, Python API, a worker's door) decides through
the same spawn pipeline, so the operator's ceilings and gate hold for all of them, and
a decision reads what was committed since the last one, not the journal's history."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import FabricCeilings
from charter.cli import main
from charter.control import Ceiling, SpawnService
from charter.core import Budget, KeyStore
from charter.ledger import Journal
from charter.runner.events import WorkerResult
from tests.invariants import check_history, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import ROOT_BUDGET
from tests.runner.programs import COST, PRELUDE, python

# Spawns each width in argv (children that sleep, so they stay live until their parent
# ends and they are killed with it) and answers with each outcome: "ok" or the reason.
PROBE = (
    PRELUDE
    + f"""
door = charter_door.Door()
out = []
for width in sys.argv[1:]:
    width = int(width)
    try:
        door.spawn({{"width": width, "objective": "probe the fabric's limits from a worker",
                    "estimated_cost": {{"tokens": 10_000 * width, **{COST!r}}}}},
                   [{{"argv": ["/bin/sleep", "30"]}}])
        out.append("ok")
    except charter_door.DoorError as e:
        out.append((e.data or {{}}).get("reason"))
door.result(json.dumps(out))
"""
)


def _charter(url: str, home: Path, settings: Settings, policy: Any = None) -> Charter:
    made, _ = Charter.initialise(
        url,
        root="estate",
        ceiling=Ceiling(budget=ROOT_BUDGET, depth=4, fanout=200),
        cell=CellSetup(cores=2, processing=1, coordination=4),
        keys=KeyStore(home),
        settings=settings,
    )
    made.close()
    return Charter.open(url, keys=KeyStore(home), settings=settings, policy=policy)


def _answer(charter: Charter, lineage: str) -> Any:
    for entry in charter.journal.entries(types=("WorkerResult",)):
        if isinstance(entry.event, WorkerResult) and entry.event.lineage == lineage:
            return json.loads(entry.event.text)
    raise AssertionError(f"{lineage} gave no answer")


def _probe(charter: Charter, state_dir: Path, *widths: int) -> Any:
    """A worker (depth 1) that spawns ``widths`` through its door; its answers."""
    result = fan_out(charter, 1, python(PROBE, *map(str, widths)), fanout=20, depth=2)
    with running(make_cell(charter, None, state_dir, door=True)) as cell:
        until_idle(cell)
    assert check_history(journal_history(charter.journal)).problems == []
    return _answer(charter, str(result.children[0].lineage))


def _operator(charter: Charter, width: int) -> str:
    intent = SpawnIntent(
        width=width,
        objective="the operator's own fan-out",
        estimated_cost=Budget.parse("tokens=10k,wall=1m,cpu=1m,mem=256MiB,egress=0"),
    )
    try:
        charter.spawn("agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE))
    except Exception as e:
        return str(getattr(e, "reason", e))
    return "ok"


@pytest.mark.sandbox
def test_the_population_ceiling_holds_for_a_workers_door_as_for_the_operator(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """The reproduction: population ceiling 3; a depth-1 worker spawns 2 (the fabric is
    then at 3 live leases), then 5 more: refused, as the operator's own spawn is."""
    settings = Settings(ceilings=FabricCeilings(population=3))
    with _charter(journal_url, tmp_path / "home", settings) as charter:
        assert _probe(charter, state_dir, 2, 5, 1) == [
            "ok",
            "population-ceiling",
            "population-ceiling",
        ]
        # Everything ended with the worker: the operator has the whole ceiling again.
        assert _operator(charter, 3) == "ok"  # the positive control
        assert _operator(charter, 1) == "population-ceiling"


@pytest.mark.sandbox
def test_the_depth_ceiling_holds_for_a_workers_door(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    settings = Settings(ceilings=FabricCeilings(depth=1))
    with _charter(journal_url, tmp_path / "home", settings) as charter:
        assert _probe(charter, state_dir, 1) == ["depth-ceiling"]
        # The positive control: children at depth 1 are within the ceiling.
        assert _operator(charter, 1) == "ok"


@pytest.mark.sandbox
def test_the_processs_gate_policy_holds_for_a_workers_door(tmp_path: Path, state_dir: Path) -> None:
    negative = FixedPolicy(Verdict.NEGATIVE)
    for name, policy, expected in (("no", negative, ["gate-negative"]), ("yes", None, ["ok"])):
        url = f"sqlite:///{tmp_path / name}.db"
        with _charter(url, tmp_path / f"home-{name}", Settings(), policy) as charter:
            assert _probe(charter, state_dir, 1) == expected


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[SpawnService]:
    built: list[SpawnService] = []
    original = SpawnService.__init__

    def counted(self: SpawnService, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(SpawnService, "__init__", counted)
    return built


@pytest.mark.sandbox
def test_every_face_reaches_the_one_spawn_service(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API, the cell and a worker's door spawn through the SpawnService the root
    built; no face builds another (counted at the constructor)."""
    settings = Settings()
    with _charter(journal_url, tmp_path / "home", settings) as charter:
        built = _counting(monkeypatch)
        used: list[SpawnService] = []
        original = SpawnService.spawn

        def spawn(self: SpawnService, *args: Any, **kwargs: Any) -> Any:
            used.append(self)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(SpawnService, "spawn", spawn)
        assert _probe(charter, state_dir, 1) == ["ok"]  # the API, then the door
        assert _operator(charter, 1) == "ok"  # the Python API, as the operator
        assert built == []
        assert len(used) == 3
        assert {id(s) for s in used} == {id(charter.spawn_service())}


def _cli(*args: str) -> int:
    """``charter ARGS`` in this process (so its constructions can be counted)."""
    try:
        main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_one_cli_command_builds_one_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI is a face of the root: a `charter spawn` builds the pipeline once, with
    the operator's ceilings from the environment (refused here, as the API would)."""
    monkeypatch.setenv("CHARTER_HOME", str(tmp_path / "home"))
    budget = "tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=0"
    assert _cli("--quiet", "init", "--root", "estate", "--budget", budget) == 0
    built = _counting(monkeypatch)
    args = ["--quiet", "spawn", "--parent", "agent:estate", "--width", "2"]
    args += ["--objective", "scan each host of the estate for open ports"]
    args += ["--est-cost", "tokens=100k,wall=1m,cpu=1m,mem=256MiB,egress=0"]
    monkeypatch.setenv("CHARTER_POPULATION_CEILING", "1")
    capsys.readouterr()
    assert _cli(*args) == 4
    assert "population-ceiling" in capsys.readouterr().err
    assert len(built) == 1
    monkeypatch.setenv("CHARTER_POPULATION_CEILING", "2")
    assert _cli(*args) == 0  # the positive control
    assert len(built) == 2  # one more command, one more root: never two in one


class _Counted:
    """Counts the stored rows a journal hands out, whichever read asks for them."""

    def __init__(self, journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        store = journal._store
        for name in ("payloads", "batches"):
            monkeypatch.setattr(store, name, self._wrap(getattr(store, name)))

    def _wrap(self, read: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Iterator[list[Any]]:
            for batch in read(*args, **kwargs):
                self.rows += len(batch)
                yield batch

        return counted


def _unrelated(charter: Charter, fanouts: int, width: int) -> None:
    """``fanouts`` fan-outs of ``width`` under another root, through the API."""
    plenty = Budget.parse("tokens=1000M,wall=100000h,cpu=100000h,mem=1000GiB,egress=1000GB")
    charter.add_agent("other", Ceiling(budget=plenty, depth=2, fanout=1_000_000))
    intent = SpawnIntent(
        width=width,
        objective="someone else's fan-out",
        estimated_cost=Budget.parse(f"tokens={width},wall={width}s,cpu={width}s,mem=0,egress=0"),
    )
    for _ in range(fanouts):
        charter.spawn("agent:other", intent, policy=FixedPolicy(Verdict.POSITIVE))


@pytest.mark.slow
def test_a_spawn_reads_rows_independent_of_the_journals_history(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spawn after a long history of unrelated fan-outs reads as many rows as one on
    a fresh journal: the root's views are current, and a decision reads only what was
    committed since. The control (views rebuilt from zero, as every spawn did before)
    reads the whole history and fails the same bound."""
    with _charter(journal_url, tmp_path / "home", Settings()) as charter:
        assert _operator(charter, 5) == "ok"
        counted = _Counted(charter.journal, monkeypatch)
        assert _operator(charter, 5) == "ok"
        fresh = counted.rows
        _unrelated(charter, fanouts=100, width=1000)  # 100,000 entries of history
        head = charter.journal.head()
        assert head is not None
        assert head[0] > 100_000
        counted.rows = 0
        assert _operator(charter, 5) == "ok"
        assert counted.rows <= fresh + 2, (counted.rows, fresh)
        # The control: a pipeline whose views start at position 0.
        counted.rows = 0
        rebuilt = SpawnService(charter.journal, keystore=charter.keys)
        caller = rebuilt.durable_caller("estate")
        intent = SpawnIntent(
            width=5,
            objective="the control: views folded from the journal's start",
            estimated_cost=Budget.parse("tokens=10k,wall=1m,cpu=1m,mem=256MiB,egress=0"),
        )
        rebuilt.spawn(caller, intent, policy=FixedPolicy(Verdict.POSITIVE))
        assert counted.rows > head[0] > fresh + 2


def test_a_foreign_history_is_read_once_then_never_again(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries another process committed are read by the next decision, once; the one
    after reads none of them again (the views track their position)."""
    with _charter(journal_url, tmp_path / "home", Settings()) as charter:
        assert _operator(charter, 5) == "ok"
        with Charter.open(journal_url, keys=charter.keys, settings=Settings()) as other:
            _unrelated(other, fanouts=3, width=500)
        counted = _Counted(charter.journal, monkeypatch)
        assert _operator(charter, 5) == "ok"
        assert counted.rows >= 3 * 500  # caught up on the other process's entries
        counted.rows = 0
        assert _operator(charter, 5) == "ok"
        assert counted.rows <= 2


class _Reads:
    """Counts, during a fan-out's decision (``SpawnService._spawn``), the views'
    refreshes and the reads of stream versions; ``between`` runs once, after the first
    versions read (another writer's commit there is a real race)."""

    def __init__(self, charter: Charter, monkeypatch: pytest.MonkeyPatch) -> None:
        self.refreshes = 0
        self.versions = 0
        self.between: Any = None
        self._deciding = False
        views, journal, service = charter.views, charter.journal, charter.spawn_service()
        refresh, versions, spawn = views.refresh, journal.stream_versions, service._spawn

        def counted_refresh(*args: Any) -> None:
            self.refreshes += self._deciding
            refresh(*args)

        def counted_versions(*args: Any) -> Any:
            got = versions(*args)
            if self._deciding:
                self.versions += 1
                between, self.between = self.between, None
                if between is not None:
                    between()
            return got

        def deciding(*args: Any) -> Any:
            self._deciding = True
            try:
                return spawn(*args)
            finally:
                self._deciding = False

        monkeypatch.setattr(views, "refresh", counted_refresh)
        monkeypatch.setattr(journal, "stream_versions", counted_versions)
        monkeypatch.setattr(service, "_spawn", deciding)


def test_a_fan_out_refreshes_the_views_once_per_attempt(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One refresh per decision attempt: a fan-out names the cells it reads on the
    views as they stand, reads their versions, then refreshes once (no refresh first
    to learn the cells). A retry after a conflict reads the versions and the views
    again: the race is a real commit by another process's root on the parent's stream,
    between the first try's read and its append."""
    with _charter(journal_url, tmp_path / "home", Settings()) as charter:
        assert _operator(charter, 2) == "ok"  # the views know the cells
        reads = _Reads(charter, monkeypatch)
        assert _operator(charter, 2) == "ok"
        assert reads.refreshes == 1
        once = reads.versions  # the reads of versions one try makes
        with Charter.open(journal_url, keys=KeyStore(tmp_path / "home")) as other:
            reads.refreshes = reads.versions = 0
            reads.between = lambda: _operator(other, 1)  # moves agent:estate's stream
            assert _operator(charter, 2) == "ok"
        assert (reads.refreshes, reads.versions) == (2, 2 * once)  # the retry read it all again
        minted = list(charter.journal.entries(types=("GrantMinted",)))
        # the root's ceiling, then 2 + 2, the racer's 1, and the raced fan-out's 2 once
        assert len(minted) == 1 + 2 + 2 + 1 + 2
