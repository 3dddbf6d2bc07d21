"""A worker tree cannot make the journal hold more than its leases' journal allowance:
each lease's floor, then its egress (docs/door.md, decision 0012). Attacks from real
sandboxes flooding waits, spawns and results, beside honest workers within the bound;
the independent fold checks every worker's bytes against floor + egress charged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from charter.app import Charter
from charter.audit.semantic import audit_history
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import BudgetRefused, UsageRecorded
from charter.control import SpawnResult, WorkerSpec
from charter.core import Budget
from charter.runner import door as door_module
from charter.runner._journal_allowance import FLOOR
from charter.runner.events import WorkerEnded, WorkerResult, WorkerWaiting
from tests.invariants import (
    check_history,
    check_journal_allowance,
    journal_bytes_by_worker,
    journal_history,
)
from tests.runner._support import make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import COST, PRELUDE, PY, REASON, python

# A worker's start: its door, and one child that echoes a number.
ONE_CHILD = (
    PRELUDE
    + REASON
    + f"""
door = charter_door.Door()
cost = {{"tokens": 10_000, **{COST!r}}}
kids = door.spawn({{"width": 1, "objective": "echo one number back to the coordinator",
                   "estimated_cost": cost}}, [{{"argv": ["/bin/echo", "1"]}}])["children"]
"""
)

# Spawns one child, then floods waits on it (and, with argv[1] == "spawn", spawns of
# 60 KB argvs), then tries a 60 KB result; reports what it was told.
FLOOD = (
    ONE_CHILD
    + """
said = []
big = {"width": 1, "objective": "a child with a large argument list",
        "estimated_cost": cost}
import hashlib
digest = b""
for _ in range(400):
    for _ in range(12000):  # work of its own: its CPU pays for the door's (test_door_cpu),
        # with room to spare on a loaded host, so the journal's bound is what binds
        digest = hashlib.sha256(digest + b"x" * 4096).digest()
    if sys.argv[1] == "spawn":
        argv = ["/bin/true", *["x" * 15_000] * 4]
        said.append(reason(lambda: door.spawn(big, [{"argv": argv}])))
    else:
        said.append(reason(lambda: door.wait(kids, 60)))
    if said[-1] != "ok":
        break
out = {"said": {r: said.count(r) for r in set(said)}, "last": said[-1],
        "result": reason(lambda: door.result("r" * 60_000))}
sys.stderr.write(json.dumps(out, sort_keys=True))
sys.exit(3)  # so the report is kept in the end's reason (its stderr's tail)
"""
)

# An honest worker: one child, one wait, one 60 KB result.
HONEST = (
    ONE_CHILD
    + """
door.wait(kids, 60)
door.result("h" * 60_000)
"""
)


def _spawn(
    charter: Charter, egress: int, *workers: WorkerSpec, cost: Budget | None = None
) -> SpawnResult:
    cost = (cost or Budget.parse("tokens=200k,wall=10m,cpu=10m,mem=4GiB,egress=0MB")).model_copy(
        update={"egress_bytes": egress}
    )
    intent = SpawnIntent.model_validate(
        {
            "width": len(workers),
            "objective": "run the workers",
            "estimated_cost": cost,
            "grant": {"fanout": 40, "depth": 2},
        }
    )
    return charter.spawn(
        "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=workers
    )


def _report(entries: list[Any], lineage: str) -> dict[str, Any]:
    end = next(
        e.event for e in entries if isinstance(e.event, WorkerEnded) and e.event.lineage == lineage
    )
    assert end.reason.startswith("stderr: "), end  # type: ignore[attr-defined]
    return json.loads(end.reason.removeprefix("stderr: "))  # type: ignore[no-any-return]


def _of(entries: list[Any], kind: type, lineage: str) -> list[Any]:
    return [e.event for e in entries if isinstance(e.event, kind) and e.event.lineage == lineage]


@pytest.mark.sandbox
def test_a_wait_flood_is_refused_past_the_floor_and_an_honest_sibling_is_served(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=2, coordination=4) as charter:
        result = _spawn(charter, 0, python(FLOOD, "wait"), python(HONEST))
        flooder, honest = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell, 240)
            assert cell.journal_allowance.used(flooder) <= FLOOR
        entries = list(charter.journal.entries())
        out = _report(entries, flooder)
        # Refused past its floor, by name, and its result too (the floor is spent).
        assert out["last"] == "journal-allowance"
        assert out["result"] == "journal-allowance"
        waits = _of(entries, WorkerWaiting, flooder)
        assert 40 < len(waits) == out["said"]["ok"] < 400
        assert _of(entries, WorkerResult, flooder) == []
        # One journaled refusal, however many were answered.
        refusals = [r for r in _of(entries, BudgetRefused, flooder) if r.operation == "journal"]
        assert [r.reason for r in refusals] == ["journal-allowance"]
        # Nothing was charged to its egress (it holds none).
        assert all(u.amount.egress_bytes == 0 for u in _of(entries, UsageRecorded, flooder))
        # The positive control: its honest sibling, on the same cell, wholly served.
        (answer,) = _of(entries, WorkerResult, honest)
        assert answer.size == 60_000
        assert len(_of(entries, WorkerWaiting, honest)) == 1
        history = journal_history(charter.journal)
        assert journal_bytes_by_worker(history)[flooder] <= FLOOR
        found = check_journal_allowance(history)
        assert found.problems == []
        assert found.checked > 0
        assert check_history(history).problems == []
        _audited_clean(charter)


@pytest.mark.sandbox
def test_a_spawn_flood_is_refused_and_egress_pays_for_more_with_the_charge_journaled_first(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    egress = 200_000
    with initialise(journal_url, tmp_path / "home", processing=2, coordination=4) as charter:
        (poor,) = (str(c.lineage) for c in _spawn(charter, 0, python(FLOOD, "spawn")).children)
        (rich,) = (str(c.lineage) for c in _spawn(charter, egress, python(FLOOD, "spawn")).children)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell, 240)
            paid = cell.journal_allowance.egress_charged(rich)
            assert cell.journal_allowance.egress_charged(poor) == 0
        entries = list(charter.journal.entries())
        poor_out, rich_out = _report(entries, poor), _report(entries, rich)
        assert poor_out["last"] == rich_out["last"] == "journal-allowance"
        # 60 KB argvs: the floor pays for two; the rich one's egress for three more.
        assert poor_out["said"]["ok"] == 2
        assert rich_out["said"]["ok"] == 2 + egress // 61_000
        # What egress paid is journaled as usage before the write it paid for.
        charged = [
            (e.position, e.event.amount.egress_bytes)
            for e in entries
            if isinstance(e.event, UsageRecorded) and e.event.lineage == rich
        ]
        assert sum(b for _, b in charged[:-1]) == paid > 2 * 60_000
        _folded_clean(charter)


# Four connections of one worker flood waits at once: the charge and the write it pays
# for are one step per lease, so racing them cannot pass the floor.
RACE = (
    ONE_CHILD
    + """
import threading
said = []
conns = [door] + [charter_door.Door() for _ in range(3)]  # four: a worker's most
def flood(mine):
    for _ in range(100):
        try:
            mine.wait(kids, 60)
            said.append("ok")
        except charter_door.DoorError as e:
            # Racing waits of one worker meet "holds no processing slot" while another
            # of them holds its coordination slot: it goes on until its allowance ends.
            said.append((e.data or {}).get("reason") or "busy")
            if said[-1] == "journal-allowance":
                return
threads = [threading.Thread(target=flood, args=(c,)) for c in conns]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.stderr.write(json.dumps({str(r): said.count(r) for r in set(said)}))
sys.exit(3)
"""
)


@pytest.mark.sandbox
def test_four_connections_racing_waits_cannot_pass_the_floor(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The door's CPU rule would bind first on this little work of the worker's own: it
    # is tested on its own (test_door_cpu); here only the journal allowance is raced.
    monkeypatch.setattr(door_module, "CPU_BASE_S", 1e9)
    with initialise(journal_url, tmp_path / "home", processing=2, coordination=4) as charter:
        (racer,) = (str(c.lineage) for c in _spawn(charter, 0, python(RACE)).children)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell, 240)
            used = cell.journal_allowance.used(racer)
        entries = list(charter.journal.entries())
        out = _report(entries, racer)
        assert out["journal-allowance"] == 4  # each connection refused, by name
        assert used <= FLOOR
        waits = _of(entries, WorkerWaiting, racer)
        assert len(waits) == out["ok"]
        refusals = [r for r in _of(entries, BudgetRefused, racer) if r.operation == "journal"]
        assert len(refusals) == 1
        history = journal_history(charter.journal)
        assert journal_bytes_by_worker(history)[racer] <= FLOOR
        found = check_journal_allowance(history)
        assert found.problems == []
        assert check_history(history).problems == []
        _audited_clean(charter)


def _folded_clean(charter: Charter) -> None:
    """The independent fold finds every worker within floor + egress charged, and the
    history sound; ``charter audit`` agrees."""
    history = journal_history(charter.journal)
    found = check_journal_allowance(history)
    assert found.problems == []
    assert found.checked > 0
    assert check_history(history).problems == []
    _audited_clean(charter)


def _audited_clean(charter: Charter) -> None:
    """charter audit agrees (its journal-allowance rule is the fold's, restated)."""
    report = audit_history(charter.journal.payloads())
    assert report.ok, report.findings


# A worker that spawns one child worker running FLOOD("spawn") with ``argv[1]`` bytes of
# egress carved from its own lease, waits on it, and answers.
CARVER = (
    PRELUDE
    + f"""
door = charter_door.Door()
flood = {FLOOD!r}
egress = int(sys.argv[1])
kids = door.spawn({{"width": 1, "objective": "flood the journal with large spawns below",
                   "grant": {{"fanout": 20, "depth": 1}},
                   "estimated_cost": {{"tokens": 100_000, "wall_ms": 1_200_000, "cpu_ms": 1_200_000,
                                      "mem_bytes": 4 << 30, "egress_bytes": egress}}}},
                  [{{"argv": ["{PY}", "-I", "-c", flood, "spawn"]}}])["children"]
door.wait(kids, 240)
door.result("waited")
"""
)


@pytest.mark.sandbox
def test_a_childs_journal_allowance_is_its_own_floor_and_the_egress_carved_for_it(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # The attack, one level down: a child floods the journal with 60 KB spawns. It gets
    # its own lease's floor and the egress its parent carved for it, charged to its own
    # lineage; the sibling tree carving none gets the floor alone (the control).
    carved = 130_000
    with initialise(journal_url, tmp_path / "home", processing=2, coordination=6) as charter:
        # (the gate refuses a bet of over half the parent's lease on any axis)
        lease = Budget.parse("tokens=400k,wall=50m,cpu=50m,mem=16GiB,egress=0MB")
        parents = _spawn(
            charter, 4 * carved, python(CARVER, str(carved)), python(CARVER, "0"), cost=lease
        )
        rich_parent, poor_parent = (str(c.lineage) for c in parents.children)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell, 400)
        entries = list(charter.journal.entries())
        ends = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
        rich, poor = (
            next(x.lineage for x in ends if x.lineage.rpartition("/")[0] == p)
            for p in (rich_parent, poor_parent)
        )
        rich_out, poor_out = _report(entries, rich), _report(entries, poor)
        assert rich_out["last"] == poor_out["last"] == "journal-allowance"
        assert poor_out["said"]["ok"] == 2  # the floor pays for two 61 KB spawns
        assert rich_out["said"]["ok"] == 2 + carved // 61_000  # its carved egress for more
        # Charged to the child's own lease, within what was carved for it; none to its
        # parent's for the child's writes.
        charged = sum(u.amount.egress_bytes for u in _of(entries, UsageRecorded, rich))
        assert 61_000 < charged <= carved  # past the floor: what the extra spawns cost
        assert sum(u.amount.egress_bytes for u in _of(entries, UsageRecorded, poor)) == 0
        assert sum(u.amount.egress_bytes for u in _of(entries, UsageRecorded, rich_parent)) == 0
        _folded_clean(charter)
