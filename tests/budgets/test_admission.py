"""Admission: never oversubscribed at any journal position, backpressure with a
retry-after, and coordinators that wait on children do not deadlock a deep tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

from charter.budgets import (
    AdmissionRefused,
    AdmissionRefusedError,
    CapInputs,
    Cells,
    ResourceClass,
    SlotAdmitted,
    processing_cap,
)
from charter.control import AdmissionService, BudgetService, Caller
from charter.core import BadInputError, Budget, KeyStore, StateError
from charter.ledger import Journal

from ._support import ceiling, intent, register_root, service

ROOT_DIR = Path(__file__).resolve().parents[2]
HUGE = Budget.parse("tokens=100000M,wall=100000h,cpu=100000h,mem=100000GiB,egress=100000GB")
P, C = ResourceClass.PROCESSING, ResourceClass.COORDINATION


def _occupancy_never_over_cap(journal: Journal, caps: dict[ResourceClass, int]) -> int:
    """Fold the cells entry by entry; at every position, no class is over its cap."""
    cells = Cells()
    checked = 0
    for entry in journal.entries(
        types=("CellConfigured", "SlotAdmitted", "SlotReleased", "AdmissionRefused")
    ):
        cells.apply(entry.event)
        if isinstance(entry.event, SlotAdmitted):
            state = cells.get(entry.event.cell)
            occupancy = state.occupancy(entry.event.resource)
            assert occupancy == entry.event.occupancy, entry.position
            assert occupancy <= entry.event.cap <= caps[entry.event.resource], entry.position
            checked += 1
    return checked


def test_adaptive_processing_cap_uses_and_records_every_input() -> None:
    base = CapInputs(cores=8, failover_reserve=2, load_average=1.0, live_peers=1)
    assert processing_cap(base, configured=100) == 5  # 8 − 2 reserve − 1 peer
    assert processing_cap(base, configured=3) == 3  # never above the configured cap
    busy = base.model_copy(update={"load_average": 16.0})
    assert processing_cap(busy, configured=100) == 2  # throttled by load: 5 × 8/16
    assert processing_cap(base.model_copy(update={"live_peers": 9}), configured=100) == 0


def test_reconfiguring_a_cell_keeps_its_holders(tmp_path: Path) -> None:
    """A reconfigured cell still counts the workers that hold its slots, refuses a cap
    below them, and refuses cap inputs that disagree with its configuration."""
    e = ResourceClass.EGRESS
    with Journal.create(f"sqlite:///{tmp_path / 'j.db'}") as journal:
        slots = AdmissionService(journal)
        slots.configure("c", {P: 1, e: 1}, cores=2, failover_reserve=0)
        slots.admit("c", ["agent:r/sa-1"], e)
        slots.configure("c", {P: 1, e: 1}, cores=4, failover_reserve=1)
        with pytest.raises(AdmissionRefusedError):  # sa-1 still holds the only slot
            slots.admit("c", ["agent:r/sa-2"], e)
        with pytest.raises(StateError, match="release slots first"):
            slots.configure("c", {P: 1, e: 0}, cores=4, failover_reserve=1)
        slots.release("c", "agent:r/sa-1", e)  # still known as a holder
        slots.admit("c", ["agent:r/sa-2"], e)  # control: the freed slot is taken
        stale = CapInputs(cores=2, failover_reserve=0, load_average=0.0, live_peers=0)
        with pytest.raises(BadInputError, match="configured with 4 and 1"):
            slots.admit("c", ["agent:r/sa-3"], P, stale)
        inputs = stale.model_copy(update={"cores": 4, "failover_reserve": 1})
        slots.admit("c", ["agent:r/sa-3"], P, inputs)
        assert _occupancy_never_over_cap(journal, {P: 1, e: 1}) == 3


def test_a_coordinator_that_already_coordinates_can_wait_again(tmp_path: Path) -> None:
    with Journal.create(f"sqlite:///{tmp_path / 'j.db'}") as journal:
        slots = AdmissionService(journal)
        slots.configure("c", {P: 2, C: 2}, cores=2, failover_reserve=0)
        inputs = CapInputs(cores=2, failover_reserve=0, load_average=0.0, live_peers=0)
        slots.admit("c", ["agent:r/sa-1"], C)
        slots.admit("c", ["agent:r/sa-1"], P, inputs)
        slots.wait_on_children("c", "agent:r/sa-1")  # gives back processing only
        state = slots.view.cells.get("c")
        assert (state.occupancy(P), state.occupancy(C)) == (0, 1)


def test_over_cap_is_refused_with_retry_after_and_journaled(tmp_path: Path) -> None:
    with Journal.create(f"sqlite:///{tmp_path / 'j.db'}") as journal:
        slots = AdmissionService(journal)
        slots.configure("c", {P: 2, C: 1}, cores=2, failover_reserve=0)
        inputs = CapInputs(cores=2, failover_reserve=0, load_average=0.0, live_peers=0)
        slots.admit("c", ["agent:r/sa-1", "agent:r/sa-2"], P, inputs)
        with pytest.raises(AdmissionRefusedError) as refused:
            slots.admit("c", ["agent:r/sa-3"], P, inputs)
        assert refused.value.retry_after_ms > 0
        (event,) = (e.event for e in journal.entries(types=("AdmissionRefused",)))
        assert isinstance(event, AdmissionRefused)
        assert (event.cap, event.occupancy, event.retry_after_ms) == (2, 2, 250)
        assert event.inputs == inputs
        slots.release("c", "agent:r/sa-1", P)
        slots.admit("c", ["agent:r/sa-3"], P, inputs)  # positive control: room again
        assert _occupancy_never_over_cap(journal, {P: 2, C: 1}) == 3


def test_deep_tree_completes_on_two_processing_slots(tmp_path: Path) -> None:
    """Depth 6, fan-out 3 (1092 workers) on a cell with 2 processing slots. Running
    workers hold processing; a worker that spawns swaps to a coordination slot while it
    waits. Each round admits what fits (deepest first) and moves every running worker
    one step; a round with no progress would be a deadlock."""
    keys = KeyStore(tmp_path / "home")
    with Journal.create(f"sqlite:///{tmp_path / 'j.db'}") as journal:
        register_root(journal, keys, "root", ceiling(budget=HUGE, depth=7))
        svc = service(journal, keys)
        budgets = BudgetService(journal)
        slots = AdmissionService(journal)
        caps = {P: 2, C: 16}
        slots.configure("cell", caps, cores=4, failover_reserve=0)
        inputs = CapInputs(cores=4, failover_reserve=0, load_average=0.0, live_peers=0)

        def fan_out(caller: Caller) -> list[Caller]:
            held = budgets.remaining(str(caller.chain[-1].grant.lineage))
            # Each child asks for all the fan-out it can be given: the subtree of a
            # fan-out of 3 at every level is carved out of the root's 5000.
            spawned = svc.spawn(caller, intent(3, held.split(2), fanout=5000))
            return [caller.child(c) for c in spawned.children]

        waiting_on: dict[str, int] = {}
        parent_of: dict[str, str] = {}
        pending: deque[tuple[int, Caller]] = deque()
        for child in fan_out(svc.durable_caller("root")):
            pending.append((1, child))
        running: list[tuple[int, Caller]] = []
        done = rounds = 0
        while pending or running:
            rounds += 1
            progress = False
            while pending:  # admit deepest first, until the cell says no
                depth, worker = pending[-1]
                try:
                    slots.admit("cell", [str(worker.chain[-1].grant.lineage)], P, inputs)
                except AdmissionRefusedError:
                    break
                pending.pop()
                running.append((depth, worker))
                progress = True
            still: list[tuple[int, Caller]] = []
            for depth, worker in running:
                name = str(worker.chain[-1].grant.lineage)
                if depth < 6:
                    try:
                        slots.wait_on_children("cell", name)  # processing -> coordination
                    except AdmissionRefusedError:
                        still.append((depth, worker))  # keep processing, try next round
                        continue
                    children = fan_out(worker)
                    waiting_on[name] = len(children)
                    for child in children:
                        parent_of[str(child.chain[-1].grant.lineage)] = name
                        pending.append((depth + 1, child))
                else:
                    slots.release("cell", name, P)
                    done += 1
                    node = name
                    while node in parent_of:  # the last child out releases its parent
                        parent = parent_of[node]
                        waiting_on[parent] -= 1
                        if waiting_on[parent]:
                            break
                        slots.release("cell", parent, C)
                        done += 1
                        node = parent
                progress = True
            running = still
            assert progress, f"deadlock in round {rounds}: {len(pending)} pending"
        assert done == 3 + 9 + 27 + 81 + 243 + 729
        assert _occupancy_never_over_cap(journal, caps) >= 1092
        refusals = list(journal.entries(types=("AdmissionRefused",)))
        assert refusals, "two slots for 1092 workers must have pushed back"


@pytest.mark.slow
def test_sixteen_concurrent_spawners_never_oversubscribe(journal_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    caps = {P: 3, C: 1}
    with Journal.create(journal_url) as journal:
        register_root(journal, KeyStore(home), "root", ceiling(budget=HUGE))
        AdmissionService(journal).configure("cell-a", caps, cores=2, failover_reserve=0)
    seconds = 30
    spawners = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.budgets._spawner",
                journal_url,
                str(home),
                str(seconds),
                str(i),
            ],
            cwd=ROOT_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT_DIR)},
        )
        for i in range(16)
    ]
    tallies = []
    for p in spawners:
        out, err = p.communicate(timeout=seconds + 240)
        assert p.returncode == 0, err.decode()[-2000:]
        tallies.append(json.loads(out))
    assert sum(t["spawns"] for t in tallies) > 16
    assert sum(t["refused"] for t in tallies) > 0, "the cell never pushed back"
    assert sum(t["refused_without_retry_after"] for t in tallies) == 0
    with Journal.open(journal_url) as journal:
        assert _occupancy_never_over_cap(journal, caps) > 0
        # Every slot taken was given back: a release that lost its races retried (on
        # PostgreSQL one used to give up with AppendConflictError and leak its slot).
        after = AdmissionService(journal)
        after.view.refresh(journal)
        assert after.view.cells.get("cell-a").occupancy(P) == 0
        refused = [e.event for e in journal.entries(types=("AdmissionRefused",))]
        assert refused
        assert all(isinstance(r, AdmissionRefused) and r.retry_after_ms > 0 for r in refused)
