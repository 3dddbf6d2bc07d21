"""The control plane's cost of one delegation (docs/delegation.md) against one spawn.

A worker's ``delegate`` decision (the agent's mint, the reservation out of the caller's
lease, the schedule and the slot, one pinned append) and its ``spawn`` of one child
with a worker, through the same composition root on SQLite, each ``--calls`` times:
CPU (``time.process_time``) and wall time per call. No sandbox runs (the decisions
only). ``python3 bench/delegate.py [--calls N]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import Ceiling, WorkerSpec
from charter.core import Budget, KeyStore

BIG = Budget.parse("tokens=1000M,wall=100h,cpu=100h,mem=8192GiB,egress=1000GB")
RESERVE = Budget.parse("tokens=10k,wall=1m,cpu=1m,mem=64MiB,egress=1MB")
CALLER = Budget.parse("tokens=100M,wall=10h,cpu=10h,mem=1024GiB,egress=10GB")


def _per_call(calls: int, fn: Callable[[], object]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.process_time() - cpu) * 1000 / calls, (time.perf_counter() - wall) * 1000 / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    calls = parser.parse_args().calls
    home = Path(tempfile.mkdtemp(prefix="charter-bench-delegate-"))
    charter, _ = Charter.initialise(
        f"sqlite:///{home}/journal.db", root="estate",
        ceiling=Ceiling(budget=BIG, fanout=100_000),
        cell=CellSetup(cores=64, processing=10_000, coordination=100, reserve=1),
        keys=KeyStore(home / "home"), settings=Settings(),
    )  # fmt: skip
    with charter:
        charter.add_agent(
            "helper", Ceiling(budget=BIG, depth=1, fanout=100_000),
            own_sandbox=("/bin/echo",), delegate_budget=RESERVE,
        )  # fmt: skip
        root = charter.spawn_service().durable_caller("estate")
        made = charter.spawn(
            root,
            SpawnIntent.model_validate(
                {
                    "width": 1,
                    "objective": "a worker that delegates to its helper",
                    "estimated_cost": CALLER,
                    "grant": {"fanout": 10 * calls},
                }
            ),
            policy=FixedPolicy(Verdict.POSITIVE),
        )
        worker = root.child(made.children[0])
        child = SpawnIntent(
            width=1, objective="a child of the worker, to compare", estimated_cost=RESERVE
        )
        spec = (WorkerSpec(argv=("/bin/echo",)),)
        charter.delegate(worker, "helper")  # warm both paths once
        charter.spawn(worker, child, workers=spec)
        for name, fn in (
            ("delegate", lambda: charter.delegate(worker, "helper")),
            ("spawn (width 1)", lambda: charter.spawn(worker, child, workers=spec)),
        ):
            cpu, wall = _per_call(calls, fn)
            print(f"{name}: {cpu:.2f} ms CPU, {wall:.2f} ms wall per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
