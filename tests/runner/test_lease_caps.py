"""Every sandbox the cell starts runs under its worker's lease and grant, not the pool's
slot budget: caps from the lease, killed at its wall clock / expiry, egress only to the
grant's destinations through the egress broker, measured egress in the exit's usage."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from charter.app import Charter
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import LeaseGranted, UsageRecorded
from charter.control import WorkerSpec
from charter.core import Budget, now_ms
from charter.runner.events import WorkerEnded, WorkerResult, WorkerStarted
from charter.sandbox import (
    EgressAttempted,
    EgressOpened,
    SandboxExited,
    SandboxLeased,
)
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.sandbox._egress_support import CLIENT, PAYLOAD, Server

SLOT = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=256MiB,egress=10MB")
MIB = 2**20


def spawn_one(charter: Charter, cost: str, argv: tuple[str, ...], **grant: Any) -> str:
    """One worker running ``argv`` whose lease is ``cost``."""
    estimated = Budget.parse(f"tokens=1000,{cost}")
    intent = SpawnIntent.model_validate(
        {"width": 1, "objective": "run under a lease", "estimated_cost": estimated, "grant": grant}
    )
    result = charter.spawn(
        "agent:estate",
        intent,
        policy=FixedPolicy(Verdict.POSITIVE),
        workers=(WorkerSpec(argv=argv),),
    )
    return str(result.children[0].lineage)


def facts(charter: Charter) -> dict[str, Any]:
    """Per worker: its lease event, its exit, its end, its result, its usage charged."""
    out: dict[str, dict[str, Any]] = {}
    sandbox_of: dict[str, str] = {}
    leased: dict[str, SandboxLeased] = {}
    for e in charter.journal.entries():
        ev = e.event
        match ev:
            case SandboxLeased():
                leased[ev.sandbox_id] = ev
            case WorkerStarted():
                sandbox_of[ev.sandbox_id] = ev.lineage
                out.setdefault(ev.lineage, {})["leased"] = leased[ev.sandbox_id]
                out[ev.lineage]["started_at"] = e.position
            case SandboxExited() if ev.sandbox_id in sandbox_of:
                out[sandbox_of[ev.sandbox_id]]["exited"] = (e.position, ev)
            case EgressOpened():
                out.setdefault("opened", []).append((e.position, ev))
            case EgressAttempted():
                out.setdefault("attempted", []).append(ev)
            case WorkerEnded():
                out.setdefault(ev.lineage, {})["ended"] = ev
            case WorkerResult():
                out.setdefault(ev.lineage, {})["result"] = ev.text
            case UsageRecorded():
                out.setdefault(ev.lineage, {})["usage"] = ev.amount
            case _:
                pass
    return out


def _settled(charter: Charter) -> None:
    history = journal_history(charter.journal)
    assert check_history(history).problems == []
    assert check_workers(history).problems == []
    assert check_settled(history).problems == []


def test_a_worker_is_capped_at_its_lease_not_the_slot_budget(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    hog = ("/usr/bin/python3", "-I", "-c", "b = b'x' * (100 << 20); print('held', len(b))")
    nap = ("/bin/sleep", "6")
    with initialise(journal_url, tmp_path / "home", processing=4) as charter:
        # The slot budget (256 MiB, 60 s) would run all four; the small leases cannot.
        small_mem = spawn_one(charter, "wall=60s,cpu=60s,mem=48MiB,egress=0", hog)
        big_mem = spawn_one(charter, "wall=60s,cpu=60s,mem=200MiB,egress=0", hog)
        short = spawn_one(charter, "wall=3s,cpu=3s,mem=64MiB,egress=0", nap)
        long = spawn_one(charter, "wall=60s,cpu=60s,mem=64MiB,egress=0", nap)
        began = time.monotonic()
        with running(make_cell(charter, None, state_dir, budget=SLOT)) as cell:
            until_idle(cell)
        took = time.monotonic() - began
        f = facts(charter)
        # Memory: the lease's 48 MiB is the cgroup's cap; 100 MiB does not fit in it.
        assert f[small_mem]["leased"].memory_bytes <= 48 * MIB
        assert f[small_mem]["leased"].budget.mem_bytes <= 48 * MIB
        assert f[small_mem]["ended"].exit_code != 0
        assert "held" not in f[small_mem].get("result", "")
        # Control: a lease with room for it (under the same slot budget) runs it.
        assert f[big_mem]["leased"].memory_bytes == 200 * MIB
        assert f[big_mem]["ended"].exit_code == 0
        assert f[big_mem]["result"].strip() == f"held {100 * MIB}"
        # Wall clock: killed when the 3 s lease runs out (the slot would allow 60 s).
        assert f[short]["leased"].wall_ms <= 3000
        _, exited = f[short]["exited"]
        assert exited.how == "wall_clock"
        assert exited.usage.wall_ms < 4000
        assert "wall clock or expiry" in f[short]["ended"].reason
        # Control: the same program with a longer lease runs to its end.
        assert f[long]["ended"].exit_code == 0
        assert f[long]["exited"][1].usage.wall_ms >= 5900
        assert took < 50
        _settled(charter)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def test_egress_is_the_grants_through_the_broker_and_its_bytes_are_charged(
    journal_url: str, tmp_path: Path, state_dir: Path, server: Server
) -> None:
    target = f"127.0.0.1:{server.port}"
    client = ("/usr/bin/python3", "-I", "-c", CLIENT, target)
    cost = "wall=60s,cpu=60s,mem=64MiB,egress=5MB"
    with initialise(journal_url, tmp_path / "home", egress=frozenset({target})) as charter:
        denied = spawn_one(charter, cost, client, egress=[])
        allowed = spawn_one(charter, cost, client, egress=[target])
        with running(make_cell(charter, None, state_dir, budget=SLOT)) as cell:
            until_idle(cell)
        f = facts(charter)
        # The attack: a worker whose grant names no destination is refused by the broker.
        assert f[denied]["leased"].egress == ()
        assert f[denied]["result"].split() == ["403", "0"]
        # Control: the granted address is reached, through the broker, once.
        assert f[allowed]["leased"].egress == (target,)
        assert f[allowed]["result"].split() == ["200", str(PAYLOAD)]
        assert server.accepted == 1
        # EgressOpened is journaled before the exit; the measured bytes are the exit's
        # usage and are charged to the worker's lease.
        exited_at, exited = f[allowed]["exited"]
        opened = [(p, ev) for p, ev in f["opened"] if ev.host_uid == f[allowed]["leased"].host_uid]
        assert len(opened) == 1
        assert f[allowed]["started_at"] < opened[0][0] < exited_at
        assert exited.usage.egress_bytes >= PAYLOAD
        assert f[allowed]["usage"].egress_bytes == exited.usage.egress_bytes
        assert f[denied]["exited"][1].usage.egress_bytes == 0
        refused = [a for a in f["attempted"] if not a.allowed and a.destination == target]
        assert len(refused) == 1
        assert refused[0].host_uid == f[denied]["leased"].host_uid
        _settled(charter)


def test_a_worker_whose_lease_cannot_run_a_sandbox_is_never_started(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=4) as charter:
        tiny = spawn_one(charter, "wall=60s,cpu=60s,mem=16MiB,egress=0", ("/bin/true",))
        brief = spawn_one(charter, "wall=1s,cpu=1s,mem=64MiB,egress=0", ("/bin/true",))
        ok = spawn_one(charter, "wall=60s,cpu=60s,mem=64MiB,egress=0", ("/bin/true",))
        # Wait (on the journaled expiry, not a guess) until the brief lease has expired.
        expiry = max(
            e.event.expires_at_ms
            for e in charter.journal.entries(types=("LeaseGranted",))
            if isinstance(e.event, LeaseGranted) and brief in e.event.lineages
        )
        deadline = time.monotonic() + 30
        while now_ms() <= expiry:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with running(make_cell(charter, None, state_dir, budget=SLOT)) as cell:
            until_idle(cell)
        f = facts(charter)
        for lineage, why in ((tiny, "below the sandbox minimum"), (brief, "no time left")):
            assert "leased" not in f[lineage]  # no sandbox was started for it
            assert f[lineage]["ended"].outcome == "failed_to_start"
            assert "not started" in f[lineage]["ended"].reason
            assert why in f[lineage]["ended"].reason
        # Control: a lease that can run a sandbox runs it.
        assert f[ok]["ended"].outcome == "exited"
        assert f[ok]["ended"].exit_code == 0
        _settled(charter)
