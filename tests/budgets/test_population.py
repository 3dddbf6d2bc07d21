"""The population ceiling is exact across roots (docs/fabric.md): fan-outs under
different roots, decided at the same moment in different processes, together never
pass it, because each appends ``PopulationGrew`` on ``fabric:population`` pinned to
the version its count was read at. Shown by the independent fold
(``tests.invariants.check_population``), whose own control is a crafted journal that
passes the ceiling the way unpinned racers would."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import POPULATION_STREAM, FabricCeilings, PopulationGrew
from charter.control import Ceiling
from charter.core import Budget, KeyStore
from tests.invariants import check_depth, check_population, journal_history

RACERS = 8
CEILING = 5
PLENTY = Budget.parse("tokens=10M,wall=1000h,cpu=1000h,mem=64GiB,egress=1GB")


def _fabric(url: str, home: Path) -> None:
    """A journal with RACERS roots (r0..r7), no ceiling needed to set it up."""
    made, _ = Charter.initialise(
        url,
        root="r0",
        ceiling=Ceiling(budget=PLENTY, depth=2, fanout=100),
        cell=CellSetup(cores=2),
        keys=KeyStore(home),
        settings=Settings(),
    )
    with made:
        for n in range(1, RACERS):
            made.add_agent(f"r{n}", Ceiling(budget=PLENTY, depth=2, fanout=100))


@pytest.mark.slow
def test_racers_under_different_roots_fill_the_population_ceiling_exactly(
    journal_url: str, tmp_path: Path
) -> None:
    """Eight processes, each under its own root, released at once by a barrier, fan out
    width 1 until refused, with a population ceiling of 5: exactly 5 workers are live,
    every other try is refused with ``population-ceiling`` (journaled), and the fold
    finds the ceiling held at every position."""
    home, barrier = tmp_path / "home", tmp_path / "barrier"
    barrier.mkdir()
    _fabric(journal_url, home)
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.budgets._populous",
                journal_url,
                str(home),
                f"r{n}",
                str(CEILING),
                str(barrier),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(RACERS)
    ]
    try:
        ready = {f"r{n}" for n in range(RACERS)}
        while {p.name for p in barrier.iterdir()} < ready:
            time.sleep(0.01)
            if any(r.poll() is not None for r in racers):
                pytest.fail("a racer exited before the barrier: " + _errors(racers))
        (barrier / "go").touch()
        outcomes = [json.loads(r.communicate(timeout=300)[0]) for r in racers]
    finally:
        for r in racers:
            if r.poll() is None:
                r.kill()
                r.wait()
    assert all(r.returncode == 0 for r in racers), _errors(racers)
    tries = [o for racer in outcomes for o in racer]
    assert tries.count("ok") == CEILING, outcomes
    assert set(tries) == {"ok", "population-ceiling"}, outcomes
    with Charter.open(journal_url, keys=KeyStore(home)) as charter:
        history = journal_history(charter.journal)
        versions = charter.journal.stream_versions([POPULATION_STREAM])
    grants = [p for _, kind, p, _ in history if kind == "LeaseGranted"]
    refused = [p["reason"] for _, kind, p, _ in history if kind == "SpawnRefused"]
    grew = [p for _, kind, p, _ in history if kind == "PopulationGrew"]
    assert sum(len(p["lineages"]) for p in grants) == CEILING
    assert refused == ["population-ceiling"] * (len(tries) - CEILING)
    # Every fan-out counted on the one before it: the counts are 1..5, no two alike.
    assert sorted(p["live"] for p in grew) == list(range(1, CEILING + 1))
    assert versions[POPULATION_STREAM] == CEILING
    found = check_population(history)
    assert found.problems == []
    assert found.checked == len(history)
    # The same history with one more grant, as a racer whose append was not pinned
    # would have made it: the fold finds it.
    at = history[-1][3]
    extra = {
        "parent": "agent:r0",
        "lineages": ["agent:r0/sa-x"],
        "expires_at_ms": _ms(at) + 3_600_000,
    }
    assert check_population([*history, (10**6, "LeaseGranted", extra, at)]).problems


def _errors(racers: list[subprocess.Popen[str]]) -> str:
    return "\n".join(
        (r.stderr.read() if r.stderr and r.poll() is not None else "")[-2000:] for r in racers
    )


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _grant(
    position: int, at: datetime, parent: str, lineages: list[str], hours: int = 1
) -> tuple[int, str, dict[str, Any], datetime]:
    until = _ms(at) + hours * 3_600_000
    return (
        position,
        "LeaseGranted",
        {"parent": parent, "lineages": lineages, "expires_at_ms": until},
        at,
    )


def _grew(
    position: int, at: datetime, live: int, width: int, ceiling: int
) -> tuple[int, str, dict[str, Any], datetime]:
    event = PopulationGrew(fanout=f"f{position}", live=live, width=width, ceiling=ceiling)
    return (position, "PopulationGrew", event.payload(), at)


T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_the_fold_flags_a_journal_that_passes_the_ceiling() -> None:
    """The control: two fan-outs under two roots decided on the same count (4 of 5, each
    adding 1), as they were before the pin. Each recorded a count within the ceiling;
    the fold counts 6 live workers, over 5, and an undercount by the second."""
    s = timedelta(seconds=1)
    crafted = [
        _grant(1, T0, "agent:a", ["agent:a/sa-1", "agent:a/sa-2", "agent:a/sa-3", "agent:a/sa-4"]),
        _grew(2, T0, live=4, width=4, ceiling=5),
        _grant(3, T0 + s, "agent:b", ["agent:b/sa-1"]),
        _grew(4, T0 + s, live=5, width=1, ceiling=5),
        (5, "LeaseReleased", {"lineage": "agent:b/sa-1"}, T0 + 2 * s),
        _grant(6, T0 + 3 * s, "agent:a", ["agent:a/sa-5"]),
        _grew(7, T0 + 3 * s, live=5, width=1, ceiling=5),  # decided on 4: right
        _grant(8, T0 + 3 * s, "agent:b", ["agent:b/sa-2"]),
        _grew(9, T0 + 3 * s, live=5, width=1, ceiling=5),  # decided on 4 too: stale
    ]
    clean = check_population(crafted[:7])
    assert clean.problems == []  # the positive control
    assert clean.checked == 7
    found = check_population(crafted)
    assert found.problems == [
        "8: 6 workers live, over the population ceiling of 5",
        "9: 6 workers live, but the fan-out counted 5",
        "9: 6 workers live, over the population ceiling of 5",
    ]


def test_the_fold_counts_ends_as_the_product_does() -> None:
    """A worker ends at its release (its subtree with it) or at its expiry: growth after
    those ends is within the ceiling, and a renewal keeps a worker live."""
    s = timedelta(seconds=1)
    crafted = [
        _grant(1, T0, "agent:a", ["agent:a/sa-1", "agent:a/sa-2"], hours=1),
        _grant(2, T0, "agent:a/sa-1", ["agent:a/sa-1/sa-1"], hours=1),
        _grew(3, T0, live=3, width=1, ceiling=3),
        (4, "LeaseReleased", {"lineage": "agent:a/sa-1"}, T0 + s),  # and its child
        _grant(5, T0 + 2 * s, "agent:b", ["agent:b/sa-1", "agent:b/sa-2"]),
        _grew(6, T0 + 2 * s, live=3, width=2, ceiling=3),
        _grant(7, T0 + 2 * s, "agent:a/sa-1", ["agent:a/sa-1/sa-2"]),  # under an ended one
    ]
    assert check_population(crafted).problems == []
    later = T0 + timedelta(hours=2)  # every lease above has expired
    renewed = _ms(later) + 3_600_000
    more = [
        _grant(8, later, "agent:c", ["agent:c/sa-1", "agent:c/sa-2", "agent:c/sa-3"]),
        _grew(9, later, live=3, width=3, ceiling=3),
    ]
    assert check_population([*crafted, *more]).problems == []
    kept = [
        _grant(1, T0, "agent:a", ["agent:a/sa-1"], hours=1),
        _grew(2, T0, live=1, width=1, ceiling=1),
        (3, "LeaseRenewed", {"lineage": "agent:a/sa-1", "expires_at_ms": renewed}, T0 + s),
        _grant(4, later, "agent:c", ["agent:c/sa-1"]),
        _grew(5, later, live=1, width=1, ceiling=1),
    ]
    assert check_population(kept).problems == [
        "4: 2 workers live, over the population ceiling of 1",
        "5: 2 workers live, but the fan-out counted 1",
        "5: 2 workers live, over the population ceiling of 1",
    ]


def test_the_depth_fold_flags_a_worker_beyond_the_ceiling() -> None:
    deep = [_grant(1, T0, "agent:a/sa-1/sa-1", ["agent:a/sa-1/sa-1/sa-1"])]
    assert check_depth(deep, 3).problems == []
    assert check_depth(deep, 2).problems == [
        "1: agent:a/sa-1/sa-1/sa-1 is 3 deep, over the depth ceiling of 2"
    ]


def test_no_ceiling_configured_writes_and_pins_nothing(journal_url: str, tmp_path: Path) -> None:
    """The cost is paid only under a ceiling: without one, a fan-out appends no
    ``PopulationGrew`` and leaves the fabric-wide stream untouched."""
    home = tmp_path / "home"
    _fabric(journal_url, home)
    intent = SpawnIntent(
        width=2,
        objective="two workers",
        estimated_cost=Budget.parse("tokens=1k,wall=1h,cpu=1m,mem=0,egress=0"),
    )
    for settings, grew in ((Settings(), 0), (Settings(ceilings=FabricCeilings(population=9)), 1)):
        with Charter.open(journal_url, keys=KeyStore(home), settings=settings) as charter:
            charter.spawn("agent:r1", intent, policy=FixedPolicy(Verdict.POSITIVE))
            versions = charter.journal.stream_versions([POPULATION_STREAM])
            assert versions[POPULATION_STREAM] == grew
