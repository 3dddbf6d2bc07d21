"""The cell against the bare warm pool: N workers of /bin/true scheduled by one fan-out
and run to completion through the cell, beside the same N sandboxes run straight from
the warm pool at the same concurrency without the journal; the latency from the commit
of the admission that made a worker runnable (for the first wave, the schedule's own
commit) to its exec, beside the projection lag of the same run; and the peak memory of
a cell process that runs many queued workers.

Smoke-run small (``--workers 10 --queued 20``); the real sizes (200 and 1000) belong on a
quiet machine. Run as root with bubblewrap installed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._support import percentile
from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import Ceiling, WorkerSpec
from charter.core import Budget, KeyStore
from charter.runner import run_cell
from charter.sandbox import WarmPool

ROOT_BUDGET = Budget.parse("tokens=1000M,wall=10000h,cpu=10000h,mem=100000GiB,egress=0MB")
SLOT = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=128MiB,egress=0MB")
# Each worker's lease lasts its share of the wall clock from the fan-out: ten minutes,
# so the last of 1000 queued workers (or of 200 on a loaded host) still has time left.
WORKER_COST = {"tokens": 5000, "wall_ms": 600_000, "cpu_ms": 10_000, "mem_bytes": 2**26}


def _charter(home: Path, concurrency: int) -> Charter:
    charter, _ = Charter.initialise(
        f"sqlite:///{home / 'journal.db'}",
        root="bench",
        ceiling=Ceiling(budget=ROOT_BUDGET, depth=2, fanout=100_000),
        cell=CellSetup(cores=os.cpu_count() or 1, processing=concurrency, coordination=1),
        keys=KeyStore(home),
        settings=Settings(),
    )
    return charter


def _spawn(charter: Charter, width: int, spec: WorkerSpec) -> None:
    cost = {k: v * width for k, v in WORKER_COST.items()} | {"egress_bytes": 0}
    intent = SpawnIntent.model_validate(
        {"width": width, "objective": "run one command per worker for the bench",
         "estimated_cost": cost}
    )  # fmt: skip
    charter.spawn("agent:bench", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=(spec,))


def _ms(at: datetime) -> float:
    return at.timestamp() * 1000


def through_cell(workers: int, concurrency: int, state: Path) -> dict[str, float]:
    """Total seconds for ``workers`` of /bin/true through the cell, then the latency of
    a run of /bin/date (its output is the exec time: the sandbox shares the host clock)."""
    home = Path(tempfile.mkdtemp(prefix="bench-cell-"))
    with _charter(home, concurrency) as charter:
        _spawn(charter, workers, WorkerSpec(argv=("/bin/true",)))
        cell = charter.cell(slot_budget=SLOT, state_dir=state, ignore_host_load=True)
        start, cpu = time.perf_counter(), time.process_time()
        run_cell(cell, once=True)
        total = time.perf_counter() - start
        cpu_ms = (time.process_time() - cpu) * 1000 / workers
    home = Path(tempfile.mkdtemp(prefix="bench-cell-"))
    with _charter(home, concurrency) as charter:
        _spawn(charter, workers, WorkerSpec(argv=("/bin/date", "+%s%N")))
        lags: list[float] = []
        done = threading.Event()

        def project() -> None:
            # The lag: how long after an entry's commit the projection holds it.
            with charter.projector() as projector:
                last = projector.position()
                while not done.is_set():
                    position = projector.catch_up()
                    if position > last:  # only steps that projected something new
                        lags.append(time.time() * 1000 - projector.at_ms(position))
                        last = position
                    time.sleep(0.005)

        follower = threading.Thread(target=project)
        follower.start()
        cell = charter.cell(slot_budget=SLOT, state_dir=state, ignore_host_load=True)
        run_cell(cell, once=True)
        done.set()
        follower.join()
        runnable: dict[str, float] = {}
        latency: list[float] = []
        for entry in charter.journal.entries(types=("SlotAdmitted", "WorkerResult")):
            event = entry.event
            if type(event).__name__ == "SlotAdmitted":
                runnable.setdefault(event.lineage, _ms(entry.recorded_at))  # type: ignore[attr-defined]
            else:
                exec_ms = int(event.text.strip()) / 1e6  # type: ignore[attr-defined]
                latency.append(exec_ms - runnable[event.lineage])  # type: ignore[attr-defined]
    return {
        "cell_s": total,
        "cell_cpu_ms_per_worker": cpu_ms,
        "exec_p50_ms": percentile(latency, 0.5),
        "exec_p99_ms": percentile(latency, 0.99),
        "projection_lag_p50_ms": percentile(lags, 0.5) if lags else float("nan"),
        "projection_lag_p99_ms": percentile(lags, 0.99) if lags else float("nan"),
    }


def straight_from_pool(workers: int, concurrency: int, state: Path) -> tuple[float, float]:
    """Total seconds for the same sandboxes from a warm pool, no journal, same threads,
    and this process's CPU per worker meanwhile (ms; the sandboxes' own is not in it)."""
    template = Path(tempfile.mkdtemp(prefix="bench-tpl-", dir=state))
    template.chmod(0o755)
    left = iter(range(workers))
    lock = threading.Lock()
    with WarmPool(template, SLOT, concurrency, state_dir=state) as pool:

        def worker() -> None:
            while True:
                with lock:
                    if next(left, None) is None:
                        return
                slot = pool.lease(timeout=60)
                slot.run(["/bin/true"])
                pool.release(slot, refill=False)

        start, cpu = time.perf_counter(), time.process_time()
        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start, (time.process_time() - cpu) * 1000 / workers


def queued_peak_mib(queued: int, concurrency: int) -> float:
    """Peak RSS of a ``charter cell run --once`` process that runs ``queued`` workers
    scheduled by one fan-out, ``concurrency`` at a time (the rest queued)."""
    home = Path(tempfile.mkdtemp(prefix="bench-cell-"))
    with _charter(home, concurrency) as charter:
        _spawn(charter, queued, WorkerSpec(argv=("/bin/true",)))
        url = charter.journal.location.display
    env = {**os.environ, "CHARTER_HOME": str(home)}
    subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, "--quiet", "cell", "run", "--once",
         "--ignore-host-load"],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--queued", type=int, default=1000)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="bench-state-"))
    state.chmod(0o755)
    pool_s, pool_cpu_ms = straight_from_pool(args.workers, args.concurrency, state)
    cell = through_cell(args.workers, args.concurrency, state)
    peak = queued_peak_mib(args.queued, args.concurrency)
    out = {
        "workers": args.workers,
        "concurrency": args.concurrency,
        "pool_s": pool_s,
        "pool_cpu_ms_per_worker": pool_cpu_ms,
        **cell,
        "cell_over_pool": cell["cell_s"] / pool_s,
        "queued": args.queued,
        "queued_peak_rss_mib": peak,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
