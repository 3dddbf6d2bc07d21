"""Supervision benchmarks, each behind its own flag (same-run baselines).

``--cascade N``: a cascade revoke. One parent lineage with N live workers below it (each
`sleep 600` in its own real sandbox, run by one cell), revoked in one append
(`Charter.revoke`); measured from the call until no process of any of their sandboxes'
host uids that lived before it is left alive (every sandbox frozen and killed in one
pass; each process known by its pid and start time), seen by an observer in
its own process (``revoke_to_all_gone_s``) and by the bench's own thread beside the
cell's (``…_seen_in_process_s``, late by however long the cell's waking driver
threads hold the interpreter lock), and until every end is journaled. Baseline, same
run: N plain `sleep 600` processes (fork/exec, no sandbox) SIGKILLed together and
reaped. The host has 1,000 sandbox uids and 2 cores: N is
what fits (a warm pool builds N sandboxes first).

``--cell``: supervision in the cell (real sandboxes, SQLite):

- honeytoken touch to committed verdict: N workers each print the host clock then read
  their decoy credential file; the latency is the quarantine verdict's commit time
  minus that clock (the sandbox shares CLOCK_REALTIME). Target p99 <= 1 s.
- supervision on vs off on bench/cell.py's workload (N workers of /bin/true through
  ``charter cell run --once``'s path): the same run with ``supervise=False`` is the
  baseline, three rounds interleaved. Target: on is at least 0.9x off's throughput.
- an idle cell's processes and sandbox uids per core, once its pool has parked.

``python3 bench/supervision.py --cell [--touches N] [--workers N]``.

Smoke-run small (``--cascade 10``). Run as root with bubblewrap installed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._support import percentile
from bench.cell import SLOT as CELL_SLOT
from bench.cell import _charter as _cell_charter
from bench.cell import _spawn as _cell_spawn
from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import Ceiling, WorkerSpec, steady_load
from charter.core import Budget, KeyStore
from charter.runner import cell_for, run_cell
from charter.runner.events import WorkerEnded, WorkerKilled, WorkerStarted
from charter.sandbox import SandboxLeased
from charter.supervision import QuarantineVerdict

ROOT_BUDGET = Budget.parse("tokens=1000M,wall=10000h,cpu=10000h,mem=100000GiB,egress=0MB")
SLOT = Budget.parse("tokens=0,wall=600s,cpu=60s,mem=64MiB,egress=0MB")
WORKER_COST = {"tokens": 5000, "wall_ms": 700_000, "cpu_ms": 10_000, "mem_bytes": 2**26}


# -- cascade revoke -------------------------------------------------------------------------


def _alive(uids: set[int]) -> int:
    """Live (not zombie) processes running as any of ``uids``: counted here on purpose,
    not by the cell's own kill pass (``runner/_kill.py``), so the bench checks it."""
    return len(_processes(uids))


# The processes of the killed sandboxes, each by its pid and start time (so a pid the
# kernel hands to a new process is not mistaken for one of them, nor a sandbox the pool
# parks afterwards on a freed uid): from "go" on stdin until none of them is left alive
# (a zombie is dead), polled from its own process, which prints that moment's
# CLOCK_MONOTONIC (one clock for every process of the host). In its own process, the
# observer shares no interpreter lock with the cell's threads (a thousand drivers
# waking at once would otherwise delay its looks), as an operator's shell does not.
_OBSERVE = """
import json, sys, time
procs = [tuple(p) for p in json.loads(sys.stdin.readline())]
print("ready", flush=True)
sys.stdin.readline()
def alive(pid, start):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] not in (b"Z", b"X") and fields[19] == start.encode()
began = time.monotonic()
while procs and time.monotonic() - began < 60:
    procs = [p for p in procs if alive(*p)]
    if procs:
        time.sleep(0.001)
print(time.monotonic() if not procs else "nan", flush=True)
"""


def _processes(uids: set[int]) -> list[tuple[int, str]]:
    """The live processes of ``uids`` now: (pid, start time in clock ticks)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid not in uids:
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            if fields[0] not in (b"Z", b"X"):
                found.append((int(entry), fields[19].decode()))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return found


def _left(procs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Those of ``procs`` still alive (the same pid and start time, not a zombie)."""
    left = []
    for pid, start in procs:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] not in (b"Z", b"X") and fields[19].decode() == start:
            left.append((pid, start))
    return left


class _Observer:
    """``_OBSERVE`` in a subprocess, for ``procs``."""

    def __init__(self, procs: list[tuple[int, str]]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _OBSERVE], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(procs) + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ready"

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def gone_at(self) -> float:
        assert self.proc.stdout is not None
        at = float(self.proc.stdout.readline())
        self.proc.wait(timeout=10)
        return at


def _intent(width: int, objective: str, fanout: int = 1) -> SpawnIntent:
    scale = width * max(fanout, 1)  # the parent's estimate covers its children's
    cost = {k: v * scale for k, v in WORKER_COST.items()} | {"egress_bytes": 0}
    return SpawnIntent.model_validate(
        {"width": width, "objective": objective, "estimated_cost": cost,
         "grant": {"fanout": fanout, "depth": 2}}
    )  # fmt: skip


def cascade_revoke(n: int, state: Path) -> dict[str, float]:
    """Revoke a parent with ``n`` live sandboxed workers below it (see the docstring)."""
    with tempfile.TemporaryDirectory(prefix="bench-cascade-") as tmp:
        home = Path(tmp)
        charter, _ = Charter.initialise(
            f"sqlite:///{home / 'journal.db'}",
            root="bench",
            ceiling=Ceiling(budget=ROOT_BUDGET, depth=3, fanout=100_000),
            # Declared as n cores so n sleepers (which use none) run at once: the
            # processing cap is at most cores - reserve.
            cell=CellSetup(cores=n, processing=n, coordination=1),
            keys=KeyStore(home),
            settings=Settings(),
        )
        with charter:
            charter.host_load = steady_load  # admit all n whatever the shared host's load
            policy = FixedPolicy(Verdict.POSITIVE)
            # The parent: a fan-out without a worker; the n workers below it.
            (parent,) = charter.spawn("agent:bench", _intent(1, "the revoked parent", n),
                                      policy=policy).children  # fmt: skip
            caller = charter.spawn_service().durable_caller("bench").child(parent)
            sleeper = WorkerSpec(argv=("/bin/sleep", "600"))
            charter.spawn(caller, _intent(n, "n sleeping workers to revoke"), policy=policy,
                          workers=(sleeper,))  # fmt: skip
            cell = cell_for(charter, slot_budget=SLOT, state_dir=state, ignore_host_load=True)
            cell.pool_capacity = n + 1
            # Its claim outlasts the run: N starts and N ends each hold the views' lock,
            # and a renewal waiting past a 15 s claim fenced the cell mid-run at 800.
            cell.claim_s = 600.0
            stop = threading.Event()
            cell.open()
            thread = threading.Thread(target=cell.run, kwargs={"until": stop.is_set})
            thread.start()
            try:
                built = time.monotonic()
                while sum(1 for e in charter.journal.entries(types=("WorkerStarted",))
                          if isinstance(e.event, WorkerStarted)) < n:  # fmt: skip
                    if time.monotonic() - built > 60 + n:
                        types = ("WorkerStarted", "SlotAdmitted", "SlotQueued", "WorkerEnded")
                        kinds = [e.event.type_name for e in charter.journal.entries(types=types)]
                        counts = {t: kinds.count(t) for t in types}
                        raise TimeoutError(f"only some of {n} workers started: {counts}")
                    time.sleep(0.2)
                start_s = time.monotonic() - built
                # The sandboxes of the workers running now (one that ended early, its
                # uid since taken by a parked sandbox, is not the revoke's to kill).
                wanted = ("SandboxLeased", "WorkerStarted", "WorkerEnded")
                leased: dict[str, int] = {}
                running: dict[str, str] = {}
                for e in charter.journal.entries(types=wanted):
                    if isinstance(e.event, SandboxLeased):
                        leased[e.event.sandbox_id] = e.event.host_uid
                    elif isinstance(e.event, WorkerStarted):
                        running[e.event.lineage] = e.event.sandbox_id
                    elif isinstance(e.event, WorkerEnded):
                        running.pop(e.event.lineage, None)
                uids = {leased[x] for x in running.values()}
                procs = _processes(uids)
                assert len(procs) >= len(running)
                observer = _Observer(procs)
                began = time.monotonic()
                observer.go()
                charter.revoke(parent.lineage, "the bench revokes the subtree")
                appended = time.monotonic()
                watching = time.monotonic()
                while procs and time.monotonic() - watching < 60:
                    procs = _left(procs)
                    time.sleep(0.001)
                assert not procs, f"{len(procs)} processes of the revoked sandboxes live on"
                gone_here = time.monotonic()
                gone = observer.gone_at()
                while sum(1 for e in charter.journal.entries(types=("WorkerEnded",))
                          if isinstance(e.event, WorkerEnded)) < n:  # fmt: skip
                    time.sleep(0.01)
                ended = time.monotonic()
            finally:
                stop.set()
                thread.join(timeout=60)
                cell.close()
    return {
        "workers": n,
        "start_all_s": start_s,
        "revoke_append_s": appended - began,
        "revoke_to_all_gone_s": gone - began,
        "revoke_to_all_gone_seen_in_process_s": gone_here - began,
        "revoke_to_all_ended_s": ended - began,
    }


def plain_kill(n: int) -> float:
    """Baseline: SIGKILL ``n`` plain `sleep 600` processes together, until all reaped."""
    procs = [subprocess.Popen(["/bin/sleep", "600"]) for _ in range(n)]
    began = time.monotonic()
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    return time.monotonic() - began


# -- the cell's supervision (--cell) ---------------------------------------------------

READER = (
    "/bin/sh",
    "-c",
    "date +%s%N; cat /workspace/.charter-secrets/*.ini >/dev/null; sleep 0.3",
)


def cell_touch_to_verdict(touches: int, state: Path) -> dict[str, float]:
    """Each of ``touches`` workers reads its decoy once: seconds from the read to the
    quarantine verdict's commit."""
    home = Path(tempfile.mkdtemp(prefix="bench-sup-"))
    with _cell_charter(home, 2) as charter:
        # Leases long enough that the last reader queued still has time to run.
        cost = {"tokens": 5000, "wall_ms": 600_000, "cpu_ms": 10_000, "mem_bytes": 2**26}
        intent = SpawnIntent.model_validate(
            {"width": touches, "objective": "read the decoy",
             "estimated_cost": {k: v * touches for k, v in cost.items()} | {"egress_bytes": 0}}
        )  # fmt: skip
        charter.spawn(
            "agent:bench", intent, policy=FixedPolicy(Verdict.POSITIVE),
            workers=(WorkerSpec(argv=READER),),
        )  # fmt: skip
        cell = cell_for(charter, slot_budget=CELL_SLOT, state_dir=state, ignore_host_load=True)
        run_cell(cell, once=True)
        read: dict[str, float] = {}
        verdict: dict[str, float] = {}
        killed: dict[str, float] = {}
        kinds = ("WorkerResult", "QuarantineVerdict", "WorkerKilled")
        for entry in charter.journal.entries(types=kinds):
            event = entry.event
            if isinstance(event, QuarantineVerdict):
                verdict.setdefault(event.lineage, entry.recorded_at.timestamp())
            elif isinstance(event, WorkerKilled):
                killed.setdefault(event.lineage, entry.recorded_at.timestamp())
            else:
                read[event.lineage] = int(event.text.split()[0]) / 1e9  # type: ignore[attr-defined]
    latency = [verdict[x] - t for x, t in read.items() if x in verdict]
    to_kill = [killed[x] - t for x, t in read.items() if x in killed]
    return {
        "kills": len(killed),
        "touch_to_kill_journaled_p50_s": percentile(to_kill, 0.5),
        "touch_to_kill_journaled_p99_s": percentile(to_kill, 0.99),
        "touches": touches,
        "reads": len(read),
        "verdicts": len(verdict),
        "touch_to_verdict_p50_s": percentile(latency, 0.5),
        "touch_to_verdict_p99_s": percentile(latency, 0.99),
        "touch_to_verdict_max_s": max(latency),
    }


def _cell_run(workers: int, state: Path, *, supervise: bool) -> float:
    home = Path(tempfile.mkdtemp(prefix="bench-sup-"))
    with _cell_charter(home, 2) as charter:
        _cell_spawn(charter, workers, WorkerSpec(argv=("/bin/true",)))
        cell = cell_for(charter, slot_budget=CELL_SLOT, state_dir=state, ignore_host_load=True)
        cell.supervise = supervise
        start = time.perf_counter()
        run_cell(cell, once=True)
        return time.perf_counter() - start


def cell_on_vs_off(workers: int, state: Path, rounds: int = 3) -> dict[str, object]:
    """bench/cell.py's workload with supervision off then on, ``rounds`` times
    interleaved (the best of each, on a shared machine)."""
    off: list[float] = []
    on: list[float] = []
    for _ in range(rounds):
        off.append(_cell_run(workers, state, supervise=False))
        on.append(_cell_run(workers, state, supervise=True))
    return {
        "workers": workers,
        "off_s": min(off),
        "on_s": min(on),
        "on_throughput_over_off": min(off) / min(on),
        "on_over_off_each_round": [round(a / b, 3) for a, b in zip(off, on, strict=True)],
    }


def cell_idle_per_core(state: Path) -> dict[str, float]:
    """An opened, idle cell (nothing scheduled): its parked sandboxes' uids and
    processes, per core, once its pool has parked its target."""
    home = Path(tempfile.mkdtemp(prefix="bench-sup-"))
    with _cell_charter(home, 2) as charter:
        cell = cell_for(charter, slot_budget=CELL_SLOT, state_dir=state, ignore_host_load=True)
        stop = threading.Event()
        cell.open()
        thread = threading.Thread(target=cell.run, kwargs={"until": stop.is_set})
        thread.start()
        try:
            pool = cell.pool
            assert pool is not None
            deadline = time.monotonic() + 60
            while pool.parked < pool.parked_target and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            uids = {s.host_uid for s in list(pool._parked)}
            procs = _alive(uids)
        finally:
            stop.set()
            thread.join()
            cell.close()
    cores = os.cpu_count() or 1
    return {
        "cores": cores,
        "parked_sandboxes": len(uids),
        "uids_per_core": len(uids) / cores,
        "processes_per_core": procs / cores,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--cascade",
        type=int,
        metavar="N",
        default=None,
        help="cascade revoke of N live sandboxed workers (vs plain kill)",
    )
    parser.add_argument("--cell", action="store_true", help="the cell's supervision figures")
    parser.add_argument("--touches", type=int, default=100, help="--cell: decoy readers")
    parser.add_argument("--workers", type=int, default=200, help="--cell: the 200-worker run")
    args = parser.parse_args()
    out: dict[str, object] = {}
    ok = True
    if args.cell:
        state = Path(tempfile.mkdtemp(prefix="bench-state-"))
        state.chmod(0o755)
        cell: dict[str, Any] = {
            **cell_touch_to_verdict(args.touches, state),
            **cell_on_vs_off(args.workers, state),
            **cell_idle_per_core(state),
        }
        out["cell"] = cell
        ok = (
            cell["verdicts"] == cell["reads"] == args.touches
            and cell["touch_to_verdict_p99_s"] <= 1.0
            and cell["on_throughput_over_off"] >= 0.9
        )
    if args.cascade is not None:
        state = Path(tempfile.mkdtemp(prefix="bench-state-"))
        state.chmod(0o755)
        cascade = cascade_revoke(args.cascade, state)
        baseline = plain_kill(args.cascade)
        out["cascade"] = {
            **cascade,
            "plain_kill_s": baseline,
            "cascade_over_plain_kill": cascade["revoke_to_all_gone_s"] / baseline,
        }
    if not out:
        parser.print_help()
        return 2
    print(json.dumps(out, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
