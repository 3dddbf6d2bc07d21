"""The composition root: initialise makes a journal with its root and its cell; the
pipeline it builds admits into that cell; settings are bad input when malformed; the
warm pool's capacity is the cell's committed processing cap."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import ResourceClass, SlotAdmitted, SlotQueued, UnknownCellError
from charter.control import Ceiling, WorkerSpec
from charter.core import BadInputError, Budget, KeyStore, StateError, now_ms

BUDGET = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB")
COST = Budget.parse("tokens=10k,wall=1m,cpu=1m,mem=64MiB,egress=1MB")


def _init(url: str, home: Path, cores: int = 3, reserve: int = 1) -> Charter:
    charter, made = Charter.initialise(
        url,
        root="estate",
        ceiling=Ceiling(budget=BUDGET),
        cell=CellSetup(cores=cores, reserve=reserve),
        keys=KeyStore(home),
        settings=Settings(),
    )
    assert str(made.root.lineage) == "agent:estate"
    return charter


def test_initialise_configures_the_cell_and_spawns_admit_into_it(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host's load is pinned: the adaptive cap (its own tests) would lower a cap of 2.
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    with _init(journal_url, tmp_path / "home") as charter:
        assert charter.processing_cap() == 2  # 3 cores less a reserve of 1
        intent = SpawnIntent(width=3, objective="scan the estate host by host", estimated_cost=COST)
        result = charter.spawn(
            "agent:estate",
            intent,
            policy=FixedPolicy(Verdict.POSITIVE),
            workers=(WorkerSpec(argv=("/bin/true",)),),  # children that run take slots
        )
        lineages = tuple(str(c.lineage) for c in result.children)
        assert result.admitted == lineages[:2]
        assert result.queued == lineages[2:]
        first, last = result.positions
        placed = [
            e.event
            for e in charter.journal.entries(first, last)
            if isinstance(e.event, SlotAdmitted | SlotQueued)
        ]
        kinds = [type(p).__name__ for p in placed]
        assert kinds == ["SlotAdmitted"] * len(result.admitted) + ["SlotQueued"]
        assert all(p.resource is ResourceClass.PROCESSING for p in placed)
        with charter.projector() as projector:
            projector.catch_up()
            (cell,) = projector.slots().cells
            assert cell.cell == "local"
            assert cell.caps["processing"] == 2
            assert cell.occupancy("processing") == len(result.admitted)


def test_initialise_twice_is_refused_and_changes_nothing(sqlite_url: str, tmp_path: Path) -> None:
    _init(sqlite_url, tmp_path / "home").close()
    with Charter.open(sqlite_url, keys=KeyStore(tmp_path / "home")) as charter:
        head = charter.journal.head()
    with pytest.raises(StateError):
        _init(sqlite_url, tmp_path / "home")
    with Charter.open(sqlite_url, keys=KeyStore(tmp_path / "home")) as charter:
        assert charter.journal.head() == head


@pytest.mark.parametrize(
    "env",
    [
        {"CHARTER_POPULATION_CEILING": "10k"},
        {"CHARTER_POPULATION_CEILING": "-1"},
        {"CHARTER_DEPTH_CEILING": "𝟗"},  # a non-ASCII digit is not a number here
        {"CHARTER_DEPTH_CEILING": "99"},  # deeper than any lineage may be
        {"CHARTER_CELL": "Not A Cell"},
    ],
)
def test_malformed_settings_are_bad_input(env: dict[str, str]) -> None:
    with pytest.raises(BadInputError):
        Settings.from_env(env)


def test_settings_from_the_environment() -> None:
    settings = Settings.from_env(
        {"CHARTER_POPULATION_CEILING": "12", "CHARTER_DEPTH_CEILING": "3", "CHARTER_CELL": "c-1"}
    )
    assert (settings.ceilings.population, settings.ceilings.depth, settings.cell) == (12, 3, "c-1")
    assert Settings.from_env({}) == Settings()


def test_an_unconfigured_cell_has_no_processing_cap(sqlite_url: str, tmp_path: Path) -> None:
    with _init(sqlite_url, tmp_path / "home") as charter, pytest.raises(UnknownCellError):
        charter.processing_cap("elsewhere")


@pytest.mark.sandbox
def test_the_warm_pool_capacity_is_the_cells_committed_processing_cap(
    sqlite_url: str, tmp_path: Path
) -> None:
    # The state directory must be traversable by the sandbox uids (broker sockets, slot
    # and workspace overlays are bound from under it; the gate's probe binds one).
    state = Path(tempfile.mkdtemp(prefix="charter-state-"))
    state.chmod(0o755)
    with _init(sqlite_url, tmp_path / "home", cores=4, reserve=1) as charter:
        template = tmp_path / "template"
        template.mkdir()
        pool = charter.warm_pool(template, COST, state_dir=state)
        try:
            assert pool.capacity == 3
        finally:
            pool.close()
        charter.configure_cell(CellSetup(cores=4, reserve=1, processing=1))
        pool = charter.warm_pool(template, COST, state_dir=state)
        try:
            assert pool.capacity == 1  # reconfigured: the pool follows the journal
        finally:
            pool.close()
    shutil.rmtree(state, ignore_errors=True)


def test_read_answers_evaluate_time_now_unless_a_position_is_asked(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A lease expires with no entry to say so: the budgets and the tree say so at once;
    ``as_of`` the head still answers as of that entry's commit time."""
    with _init(sqlite_url, tmp_path / "home") as charter:
        short = Budget.parse("tokens=10k,wall=1s,cpu=1s,mem=1MiB,egress=1KB")
        intent = SpawnIntent(
            width=1, objective="scan the estate host by host", estimated_cost=short
        )
        result = charter.spawn("agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE))
        child = str(result.children[0].lineage)
        with charter.projector() as projector:
            projector.catch_up()
            assert projector.budgets().get(child).status == "active"
            expires = projector.budgets().get(child).expires_at_ms
            assert expires is not None
            while now_ms() <= expires:  # bounded by the lease's own end
                time.sleep(0.02)
            head = projector.position()
            assert projector.budgets().get(child).status == "expired"
            assert {n.lineage: n.status for n in projector.tree().nodes}[child] == "expired"
            assert projector.budgets(as_of=head).get(child).status == "active"
