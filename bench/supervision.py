"""Supervision in the cell (real sandboxes, SQLite).

``--cell`` (this file's cell functions; other sections of this file have their own
flags):

- honeytoken touch to committed verdict: N workers each print the host clock then read
  their decoy credential file; the latency is the quarantine verdict's commit time
  minus that clock (the sandbox shares CLOCK_REALTIME). Target p99 <= 1 s.
- supervision on vs off on bench/cell.py's workload (N workers of /bin/true through
  ``charter cell run --once``'s path): the same run with ``supervise=False`` is the
  baseline. Target: on is at least 0.9x off's throughput.
- an idle cell's processes and sandbox uids per core, once its pool has parked.

Run as root: ``python3 bench/supervision.py --cell [--touches N] [--workers N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._support import percentile
from bench.cell import SLOT, _charter, _spawn
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import WorkerSpec
from charter.runner import cell_for, run_cell
from charter.supervision import QuarantineVerdict

READER = (
    "/bin/sh",
    "-c",
    "date +%s%N; cat /workspace/.charter-secrets/*.ini >/dev/null; sleep 0.3",
)


def cell_touch_to_verdict(touches: int, state: Path) -> dict[str, float]:
    """Each of ``touches`` workers reads its decoy once: seconds from the read to the
    quarantine verdict's commit."""
    home = Path(tempfile.mkdtemp(prefix="bench-sup-"))
    with _charter(home, 2) as charter:
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
        cell = cell_for(charter, slot_budget=SLOT, state_dir=state, ignore_host_load=True)
        run_cell(cell, once=True)
        read: dict[str, float] = {}
        verdict: dict[str, float] = {}
        for entry in charter.journal.entries(types=("WorkerResult", "QuarantineVerdict")):
            event = entry.event
            if isinstance(event, QuarantineVerdict):
                verdict.setdefault(event.lineage, entry.recorded_at.timestamp())
            else:
                read[event.lineage] = int(event.text.split()[0]) / 1e9  # type: ignore[attr-defined]
    latency = [verdict[x] - t for x, t in read.items() if x in verdict]
    return {
        "touches": touches,
        "reads": len(read),
        "verdicts": len(verdict),
        "touch_to_verdict_p50_s": percentile(latency, 0.5),
        "touch_to_verdict_p99_s": percentile(latency, 0.99),
        "touch_to_verdict_max_s": max(latency),
    }


def _through_cell(workers: int, state: Path, *, supervise: bool) -> float:
    home = Path(tempfile.mkdtemp(prefix="bench-sup-"))
    with _charter(home, 2) as charter:
        _spawn(charter, workers, WorkerSpec(argv=("/bin/true",)))
        cell = cell_for(charter, slot_budget=SLOT, state_dir=state, ignore_host_load=True)
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
        off.append(_through_cell(workers, state, supervise=False))
        on.append(_through_cell(workers, state, supervise=True))
    return {
        "workers": workers,
        "off_s": min(off),
        "on_s": min(on),
        "on_throughput_over_off": min(off) / min(on),
        "on_over_off_each_round": [round(a / b, 3) for a, b in zip(off, on, strict=True)],
    }


def _processes_of(uids: set[int]) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    n += 1
            except FileNotFoundError:
                continue
    return n


def cell_idle_per_core(state: Path) -> dict[str, float]:
    """An opened, idle cell (nothing scheduled): its parked sandboxes' uids and
    processes, per core, once its pool has parked its target."""
    home = Path(tempfile.mkdtemp(prefix="bench-sup-"))
    with _charter(home, 2) as charter:
        cell = cell_for(charter, slot_budget=SLOT, state_dir=state, ignore_host_load=True)
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
            procs = _processes_of(uids)
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
    parser.add_argument("--cell", action="store_true", help="the cell's supervision figures")
    parser.add_argument("--touches", type=int, default=100)
    parser.add_argument("--workers", type=int, default=200)
    args = parser.parse_args()
    if not args.cell:
        parser.error("name a section: --cell")
    state = Path(tempfile.mkdtemp(prefix="bench-state-"))
    state.chmod(0o755)
    out: dict[str, Any] = {
        **cell_touch_to_verdict(args.touches, state),
        **cell_on_vs_off(args.workers, state),
        **cell_idle_per_core(state),
    }
    print(json.dumps(out, indent=2))
    ok = (
        out["verdicts"] == out["reads"] == args.touches
        and out["touch_to_verdict_p99_s"] <= 1.0
        and out["on_throughput_over_off"] >= 0.9
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
