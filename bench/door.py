"""The worker door under a flood, and the journal a worker tree can make it hold.

1. Control-plane CPU per worker CPU under a **sign flood** (64 KiB messages) and a
   **result flood** (60 KB results), each from a real sandbox through the cell's door,
   the flooder reconnecting whenever it is refused. Two figures each, against the
   worker's own CPU (its cgroup's count at exit): the door's thread CPU serving it
   (``Door.served_history``, what the door's rule bounds) and the whole cell process's
   CPU over the same run less a same-run baseline (a worker that never calls the door:
   the cell's own cost of running one worker). Beside them, the raw library: PyNaCl
   signing the same messages in-process, per signature. Target: both ratios <= 1.
2. **Journal bytes of a maximal tree**: WIDTH workers under one fan-out, each spawning a
   child and flooding waits on it until refused, then trying a 60 KB result; its lease
   holds no egress (the docs' default cost). Measured: the bytes the journal's rows hold
   after it (raw sqlite3 over the stored rows, the chain's hashes included) per lease,
   against the documented bound per lease (FLOOR + the lease's fixed-size events), and
   that bound for the default fan-out of 1,000.
3. **Copy-back**: a persistent workspace of the most entries allowed (20,000)
   delivered: the worker's cgroup count with the copy-back in it (it runs in a child in
   the sandbox's CPU cgroups) against the same command's without one, and the
   launcher's own CPU, against the worker's CPU making the files.

Run as root with bubblewrap: ``python3 bench/door.py [--flood N] [--width W]``. Exits 1
when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nacl.signing import SigningKey

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import Ceiling, WorkerSpec
from charter.core import Budget, KeyStore
from charter.runner import cell_for, run_cell
from charter.runner._journal_allowance import FLOOR
from charter.runner.door import Door
from charter.sandbox import Launcher
from charter.sandbox._workspace import MAX_COMMIT_ENTRIES

ROOT_BUDGET = Budget.parse("tokens=1000M,wall=10000h,cpu=10000h,mem=100000GiB,egress=0MB")
SLOT = Budget.parse("tokens=0,wall=120s,cpu=120s,mem=256MiB,egress=0MB")
COST = {"tokens": 10_000, "wall_ms": 120_000, "cpu_ms": 120_000, "mem_bytes": 2**28}
PY = "/usr/bin/python3"
PRELUDE = "import sys, json; sys.path.insert(0, '/workspace'); import charter_door\n"
CPU_TARGET = 1.0
DEFAULT_FANOUT = 1000
FIXED_PER_LEASE = 8 * 1024  # docs/door.md: a lease's fixed-size events, 5-8 KiB

FLOOD = (
    PRELUDE
    + """
kind, n = sys.argv[1], int(sys.argv[2])
message = b"m" * 65_536
door, ok, refused = charter_door.Door(), 0, 0
for _ in range(n):
    try:
        if kind == "sign":
            door.sign("flood/v1", message)
        elif kind == "result":
            door.result("r" * 60_000)
        ok += 1
    except charter_door.DoorError as e:
        refused += 1
        if e.code in (-32002, -32001, -32603):  # closed: the attacker reconnects
            try:
                door.close()
                door = charter_door.Door()
            except OSError:
                pass
sys.stderr.write(json.dumps({"ok": ok, "refused": refused}))
sys.exit(3)  # the report is kept in the end's reason (its stderr's tail)
"""
)

# The baseline worker: as much CPU of its own, no door at all.
IDLE = (
    "import hashlib, sys\nd = b''\nfor _ in range(int(sys.argv[1])):\n"
    "    d = hashlib.sha256(d + b'x' * 65536).digest()\n"
    "sys.stderr.write('{}')\nsys.exit(3)\n"
)

TREE = (
    PRELUDE
    + f"""
door = charter_door.Door()
cost = {{"tokens": 10_000, **{COST!r}, "egress_bytes": 0}}
kids = door.spawn({{"width": 1, "objective": "echo one number back to the coordinator",
                   "estimated_cost": cost}}, [{{"argv": ["/bin/echo", "1"]}}])["children"]
import hashlib
said, digest = [], b""
while True:
    for _ in range(3000):  # work of its own between waits: its CPU pays for the door's
        digest = hashlib.sha256(digest + b"x" * 4096).digest()
    try:
        door.wait(kids, 60)
        said.append("ok")
    except charter_door.DoorError as e:
        said.append((e.data or {{}}).get("reason"))
        break
try:
    door.result("r" * 60_000)
    said.append("result")
except charter_door.DoorError as e:
    said.append("result:" + str((e.data or {{}}).get("reason")))
sys.stderr.write(json.dumps({{r: said.count(r) for r in set(said)}}))
sys.exit(3)
"""
)


def _charter(home: Path, processing: int) -> Charter:
    charter, _ = Charter.initialise(
        f"sqlite:///{home / 'journal.db'}",
        root="bench",
        ceiling=Ceiling(budget=ROOT_BUDGET, depth=3, fanout=100_000),
        cell=CellSetup(cores=os.cpu_count() or 1, processing=processing, coordination=64),
        keys=KeyStore(home),
        settings=Settings(),
    )
    return charter


def _spawn(charter: Charter, specs: list[WorkerSpec], fanout: int = 0, scale: int = 1) -> list[str]:
    """``specs`` under one fan-out, each leased ``scale`` × COST (a coordinator's lease
    must hold its child's several times over, or the gate judges the bet too large)."""
    width = len(specs)
    cost = {k: v * width * scale for k, v in COST.items()} | {"egress_bytes": 0}
    intent = SpawnIntent.model_validate(
        {"width": width, "objective": "run one command per worker for the bench",
         "estimated_cost": cost, "grant": {"fanout": fanout}}
    )  # fmt: skip
    result = charter.spawn(
        "agent:bench", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=tuple(specs)
    )
    return [str(c.lineage) for c in result.children]


def _worker_cpu_s(charter: Charter, lineage: str) -> float:
    sandbox = next(
        e.event.sandbox_id  # type: ignore[attr-defined]
        for e in charter.journal.entries(types=("WorkerStarted",))
        if e.event.lineage == lineage  # type: ignore[attr-defined]
    )
    exited = next(
        e.event
        for e in charter.journal.entries(types=("SandboxExited",))
        if e.event.sandbox_id == sandbox  # type: ignore[attr-defined]
    )
    return float(exited.usage.cpu_ms) / 1000  # type: ignore[attr-defined]


def _run(spec: WorkerSpec, state: Path) -> dict[str, Any]:
    """One worker through a fresh cell: its CPU, the door's CPU for it, and the cell
    process's CPU over the run."""
    home = Path(tempfile.mkdtemp(prefix="bench-door-"))
    with _charter(home, 1) as charter:
        (lineage,) = _spawn(charter, [spec])
        cell = cell_for(charter, slot_budget=SLOT, state_dir=state, ignore_host_load=True)
        door = cell.key_broker
        assert isinstance(door, Door)
        start = time.process_time()
        run_cell(cell, once=True)
        process_s = time.process_time() - start
        end = next(
            e.event
            for e in charter.journal.entries(types=("WorkerEnded",))
            if e.event.lineage == lineage  # type: ignore[attr-defined]
        )
        return {
            "worker_s": _worker_cpu_s(charter, lineage),
            "served_s": door.served_history.get(lineage, 0.0),
            "process_s": process_s,
            "said": end.reason.removeprefix("stderr: "),  # type: ignore[attr-defined]
        }


def flood(kind: str, n: int, state: Path) -> dict[str, Any]:
    attack = _run(WorkerSpec(argv=(PY, "-I", "-c", FLOOD, kind, str(n))), state)
    base = _run(WorkerSpec(argv=(PY, "-I", "-c", IDLE, str(n // 4))), state)
    plane = max(0.0, attack["process_s"] - base["process_s"])
    said = json.loads(attack["said"])
    out = {
        "requests": n,
        "served": said["ok"],
        "refused": said["refused"],
        "worker_cpu_s": round(attack["worker_s"], 3),
        "door_cpu_s": round(attack["served_s"], 3),
        "door_per_worker": round(attack["served_s"] / attack["worker_s"], 3),
        "process_cpu_s": round(attack["process_s"], 3),
        "baseline_process_cpu_s": round(base["process_s"], 3),
        "plane_per_worker": round(plane / attack["worker_s"], 3),
    }
    if kind == "sign":
        key, message = SigningKey.generate(), b"m" * 65_536
        start = time.process_time()
        for _ in range(200):
            key.sign(message)
        out["raw_sign_ms"] = round((time.process_time() - start) / 200 * 1000, 3)
    return out


def _stored_bytes(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        (total,) = conn.execute(
            "SELECT SUM(length(originator_id) + 8 + length(topic) + length(state) + 64) "
            "FROM stored_events"
        ).fetchone()
    return int(total or 0)


def tree(width: int, state: Path) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="bench-door-tree-"))
    with _charter(home, 2) as charter:
        before = _stored_bytes(home / "journal.db")
        spec = WorkerSpec(argv=(PY, "-I", "-c", TREE))
        lineages = _spawn(charter, [spec] * width, fanout=1, scale=4)
        cell = cell_for(charter, slot_budget=SLOT, state_dir=state, ignore_host_load=True)
        allowance = cell.journal_allowance
        start = time.perf_counter()
        run_cell(cell, once=True)
        elapsed = time.perf_counter() - start
        used = [allowance.used(x) for x in lineages]
        said: dict[str, int] = {}
        for e in charter.journal.entries(types=("WorkerEnded",)):
            if e.event.lineage in lineages:  # type: ignore[attr-defined]
                for k, v in json.loads(e.event.reason.removeprefix("stderr: ")).items():  # type: ignore[attr-defined]
                    said[k] = said.get(k, 0) + v
        after = _stored_bytes(home / "journal.db")
        refusals = len(
            [
                e
                for e in charter.journal.entries(types=("BudgetRefused",))
                if e.event.operation == "journal"  # type: ignore[attr-defined]
            ]
        )
    # Each flooding worker's share: its own rows and its child's (a whole lease at most:
    # a maximal tree's every lease floods, so this pair bounds a lease from above).
    per_worker = (after - before) / width
    return {
        "leases": 2 * width,
        "seconds": round(elapsed, 1),
        "journal_bytes": after - before,
        "bytes_per_flooding_worker_and_child": round(per_worker),
        "charged_max": max(used),
        "floor": FLOOR,
        "refusals_journaled": refusals,
        "workers_said": said,
        "measured_bound_default_fanout_MiB": round((1 + DEFAULT_FANOUT) * per_worker / 2**20, 1),
        "documented_bound_default_fanout_MiB": round(
            (1 + DEFAULT_FANOUT) * (FLOOR + FIXED_PER_LEASE) / 2**20, 1
        ),
    }


def copy_back(state: Path) -> dict[str, Any]:
    """MAX_COMMIT_ENTRIES - 100 files delivered to a persistent workspace: the launcher's
    own CPU (its thread's) and the worker's cgroup count, each less the same run
    delivering none, against the same command's cgroup count in a private workspace
    (nothing to deliver: the worker's own CPU making the files). The copy-back runs in a
    child placed in the sandbox's CPU cgroups, so it shows in the cgroup's count, and
    the launcher's is what spawning and waiting for that child costs."""
    files = MAX_COMMIT_ENTRIES - 100
    make = (
        "import os, sys\nn = int(sys.argv[1])\nfor d in range(100):\n"
        "    os.mkdir(f'/workspace/d{d}')\n"
        "for i in range(n - 100):\n"
        "    open(f'/workspace/d{i % 100}/f{i}', 'w').write('x')\n"
    )
    budget = Budget.parse("tokens=0,wall=120s,cpu=120s,mem=512MiB,egress=0MB")
    launcher = Launcher(state_dir=state)
    out: dict[str, float] = {}
    for label, n, persistent in (
        ("none", 100, True), ("full", files, True), ("private", files, False),
    ):  # fmt: skip
        ws = Path(tempfile.mkdtemp(prefix="bench-door-ws-"))
        ws.chmod(0o777)
        start = time.thread_time()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        outcome = launcher.run(
            budget, [PY, "-I", "-c", make, str(n)], workspace=ws if persistent else None
        )
        out[f"launcher_{label}_s"] = time.thread_time() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out[f"children_{label}_s"] = (after.ru_utime + after.ru_stime) - (
            children.ru_utime + children.ru_stime
        )
        out[f"worker_{label}_s"] = outcome.usage.cpu_ms / 1000
        out[f"delivered_{label}"] = sum(len(f) for _, _, f in os.walk(ws))
    launcher_copy = out["launcher_full_s"] - out["launcher_none_s"]
    made = out["worker_private_s"]
    in_cgroup = out["worker_full_s"] - made
    return {
        "files": files,
        "delivered": int(out["delivered_full"]),
        "worker_cpu_making_s": round(made, 3),
        "worker_cgroup_with_copy_back_s": round(out["worker_full_s"], 3),
        "copy_back_in_worker_cgroup_s": round(in_cgroup, 3),
        "launcher_copy_back_cpu_s": round(launcher_copy, 3),
        "launcher_per_worker": round(launcher_copy / made, 3) if made > 0 else float("inf"),
        "waited_children_cpu_full_s": round(out["children_full_s"], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flood", type=int, default=3000, help="requests per flood")
    parser.add_argument("--width", type=int, default=8, help="workers in the tree")
    parser.add_argument("--skip-copy", action="store_true")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="bench-door-state-"))
    report: dict[str, Any] = {
        "sign_flood": flood("sign", args.flood, state),
        "result_flood": flood("result", args.flood, state),
        "tree": tree(args.width, state),
    }
    if not args.skip_copy:
        report["copy_back"] = copy_back(state)
    print(json.dumps(report, indent=2))
    missed = [
        k
        for k in ("sign_flood", "result_flood")
        if report[k]["door_per_worker"] > CPU_TARGET or report[k]["plane_per_worker"] > CPU_TARGET
    ]
    if report["tree"]["charged_max"] > FLOOR:
        missed.append("tree")
    for k in missed:
        print(f"MISSED: {k}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
