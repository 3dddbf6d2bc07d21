"""The fabric's ceilings across cells (docs/fabric.md): three ``charter cell run``
processes on one PostgreSQL journal, configured with a population ceiling of 8 and a
depth ceiling of 2, run a two-level fan-out: the operator's 6 coordinators, each
spawning 2 leaves through its door (on whichever cell runs it), all at one instant
(they race for the room the ceiling leaves), then retrying while the fabric is full;
each leaf tries to spawn a third level. The independent folds over the journal show the
fabric never held more than 8 live workers and none deeper than 2; the coordinators
were refused ``population-ceiling`` on the way (the ceiling was reached), the leaves
``depth-ceiling``; ``charter audit`` is clean."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import FabricCeilings
from charter.control import Ceiling, WorkerScheduled, WorkerSpec
from charter.core import Budget, KeyStore
from charter.runner.events import CellStarted, WorkerEnded
from tests.invariants import check_depth, check_history, check_population, journal_history
from tests.runner.programs import PRELUDE, PY, REASON
from tests.runner.test_fabric import _cell, _cli, _load, _wait

pytestmark = [pytest.mark.slow, pytest.mark.sandbox, pytest.mark.postgres]

CELLS = ("c1", "c2", "c3")
POPULATION = 8
DEPTH = 2
COORDINATORS = 6  # all run at once, with room for their leaves beside them
LEAVES = 2  # 6 coordinators + 2 leaves fill the fabric: one coordinator's leaves at a time
START_S = 5.0  # the coordinators' first fan-outs, all at this instant after the spawn
ROOT = Budget.parse("tokens=10M,wall=100h,cpu=10h,mem=64GiB,egress=1GB")
COST = {"wall_ms": 300_000, "cpu_ms": 20_000, "mem_bytes": 64 << 20, "egress_bytes": 0}
ENV = {"CHARTER_POPULATION_CEILING": str(POPULATION), "CHARTER_DEPTH_CEILING": str(DEPTH)}

# A leaf tries to fan out one level deeper (beyond the depth ceiling), holds its slot a
# moment, and answers with what its door said.
LEAF = (
    PRELUDE
    + REASON
    + f"""
import time
door = charter_door.Door()
said = reason(lambda: door.spawn({{"width": 1, "objective": "one level too deep",
                                 "estimated_cost": {{"tokens": 10_000, **{COST!r}}}}},
                                [{{"argv": ["/bin/true"]}}]))
door.result(said)
"""
)

# A coordinator fans out its leaves, first at the instant it is given (every
# coordinator at once, on three cells: they race for the room left), then retrying
# while the fabric is full; it waits, and answers with how many times it was refused
# and what its leaves said.
COORDINATOR = (
    PRELUDE
    + f"""
import time
door = charter_door.Door()
width, start = int(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
cost = {{k: v * 2 * width for k, v in {COST!r}.items()}}
full = 0
while True:
    try:
        kids = door.spawn({{"width": width, "objective": "leaves that try to go deeper",
                           "grant": {{"depth": 2, "fanout": 1}},
                           "estimated_cost": {{"tokens": 40_000 * width, **cost}}}},
                          [{{"argv": ["{PY}", "-I", "-c", {LEAF!r}]}}])["children"]
        break
    except charter_door.DoorError as e:
        if (e.data or {{}}).get("reason") != "population-ceiling" or full >= 400:
            raise
        full += 1
        # Work before the retry (not a sleep): the door serves a worker at most 0.25 x
        # its own CPU (+ 0.1 s), and a refused fan-out costs the door some.
        spent = time.process_time()
        while time.process_time() - spent < 0.3:
            pass
answers = door.wait(kids, 60)["children"]
door.result(json.dumps({{"full": full, "leaves": sorted(answers[k]["result"] for k in kids)}}))
"""
)


def _story(history: list) -> str:
    """What happened, for a run that did not finish."""
    kinds = Counter(e.event.type_name for e in history)
    notes = [
        f"{e.position} {e.event.type_name} {e.event.payload()}"[-600:]
        for e in history
        if e.event.type_name in ("SpawnRefused", "WorkerEnded", "WorkerResult", "PopulationGrew")
    ]
    return f"{dict(kinds)}\n" + "\n".join(notes[-60:])


def test_three_cells_hold_the_population_and_depth_ceilings(
    pg_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    settings = Settings(ceilings=FabricCeilings(population=POPULATION, depth=DEPTH))
    charter, _ = Charter.initialise(
        pg_url,
        root="estate",
        ceiling=Ceiling(budget=ROOT, depth=4, fanout=100),
        cell=CellSetup(cores=8, processing=8, coordination=64),
        keys=KeyStore(home),
        settings=settings,
    )
    with charter:
        for name in CELLS:  # 8 cores less 2 live peers on this host: a cap of 6 each
            charter.configure_cell(CellSetup(cores=8, processing=8, coordination=64), name)
    procs = [_cell(pg_url, home, state_dir, name, env=ENV) for name in CELLS]
    try:
        with Charter.open(pg_url, keys=KeyStore(home), settings=settings) as charter:
            journal = charter.journal
            read: list = []

            def entries() -> list:
                read.extend(journal.entries(start=read[-1].position + 1 if read else None))
                return read

            def started() -> bool:
                return {e.event.cell for e in entries() if isinstance(e.event, CellStarted)} >= set(
                    CELLS
                )

            _wait("three cells to start", started, 60, procs)
            intent = SpawnIntent.model_validate(
                {
                    "width": COORDINATORS,
                    "objective": "coordinators whose leaves race for the fabric",
                    "estimated_cost": Budget.parse("tokens=1M,wall=10h,cpu=1h,mem=8GiB,egress=0MB"),
                    "grant": {"fanout": 2 * LEAVES, "depth": 3},  # each leaf may ask for one
                }
            )
            start = str(time.time() + START_S)
            spec = WorkerSpec(argv=(PY, "-I", "-c", COORDINATOR), inputs=(str(LEAVES), start))
            charter.spawn(
                "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=(spec,)
            )
            total = COORDINATORS * (LEAVES + 1)

            def all_ended() -> bool:
                history = entries()
                scheduled = {
                    e.event.lineage for e in history if isinstance(e.event, WorkerScheduled)
                }
                done = {e.event.lineage for e in history if isinstance(e.event, WorkerEnded)}
                return len(scheduled) == total and scheduled <= done

            try:
                _wait("every worker to end", all_ended, 75, procs)
            except BaseException:
                print(_story(entries()))
                raise
            payloads = journal_history(journal)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    ends = {p["lineage"]: p for _, kind, p, _ in payloads if kind == "WorkerEnded"}
    failed = [e for e in ends.values() if (e["outcome"], e["exit_code"]) != ("exited", 0)]
    assert failed == [], [str(e)[-800:] for e in failed]
    results = {p["lineage"]: p["text"] for _, kind, p, _ in payloads if kind == "WorkerResult"}
    coordinators = [lin for lin in ends if lin.count("/") == 1]
    told = [json.loads(results[lin]) for lin in coordinators]
    # Every leaf was refused its third level by the depth ceiling.
    assert [t["leaves"] for t in told] == [["depth-ceiling"] * LEAVES] * COORDINATORS, told
    # The fabric was full: coordinators' doors were refused and retried.
    refused = [p for _, kind, p, _ in payloads if kind == "SpawnRefused"]
    full = [p for p in refused if p["reason"] == "population-ceiling"]
    assert full, refused
    assert all(p["actor"].count("/") == 1 for p in full)
    assert sum(t["full"] for t in told) == len(full)
    grew = [p for _, kind, p, _ in payloads if kind == "PopulationGrew"]
    assert max(p["live"] for p in grew) == POPULATION  # reached, never passed
    # Placed across the cells: the ceiling held for workers of more than one.
    cells = {p["cell"] for _, kind, p, _ in payloads if kind == "WorkerStarted"}
    assert len(cells) >= 2, cells
    # The independent folds.
    population = check_population(payloads)
    assert population.problems == []
    assert check_depth(payloads, DEPTH).problems == []
    assert check_history(payloads).problems == []
    audit = _cli(pg_url, home, state_dir, "--json", "audit")
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-2000:]
    print(
        f"\nfabric ceilings: {len(ends)} workers on {sorted(cells)}, {len(full)} door "
        f"refusals at the population ceiling, load {_load()}"
    )
