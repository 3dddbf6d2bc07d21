"""Many cells on one PostgreSQL journal (docs/fabric.md), in one run:

1. **throughput**: N workers of /bin/true, one fan-out, run by three ``charter cell run``
   processes on one journal against one ``cell run`` on a journal set up the same way
   (each run on a fresh database): workers per second from the fan-out's commit to the
   last end, the ratio, and the journal's cost per worker (entries, bytes, commits) and
   the cells' CPU per worker (their rusage);
2. **commit rate**: what the database itself commits, one small append per
   transaction, from 1 and from 3 writer processes with group commit off (as writers on
   different hosts are: group commit is per host);
3. **wake-up**: commit-to-start latency of an idle cell woken by ``LISTEN`` against the
   same cell polling (``Journal.listen`` disabled), each fan-out committed by another
   process: from the schedule's commit to the start's commit (the database's clock),
   and the idle cell's CPU per second (polling reads the head every 10 ms);
4. **model**: the projection to 10 hosts and 10,000 live workers (printed with its
   inputs; docs/performance.md, "Many cells", writes it out).

``python3 bench/fabric.py --workers 150 --latency 20`` (root, bubblewrap, PostgreSQL at
``CHARTER_TEST_PG`` or 127.0.0.1:5432).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench._support import percentile, pg_conninfo, scratch_database
from bench.cell import _spawn as spawn
from charter.app import CellSetup, Charter, Settings
from charter.control import Ceiling, WorkerScheduled, WorkerSpec, steady_load
from charter.core import Budget, Event, KeyStore
from charter.ledger import Journal
from charter.runner.cell import Cell
from charter.runner.events import WorkerEnded, WorkerStarted

ADMIN = os.environ.get("CHARTER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
WT = Path(__file__).resolve().parents[1]
ROOT = Budget.parse("tokens=1000M,wall=10000h,cpu=10000h,mem=100000GiB,egress=0MB")
SLOT = "tokens=0,wall=60s,cpu=60s,mem=128MiB,egress=0MB"
TRUE = WorkerSpec(argv=("/bin/true",))


def _home(url: str, cells: list[str], tmp: Path) -> Path:
    home = tmp / f"home-{len(cells)}"
    charter, _ = Charter.initialise(
        url,
        root="bench",
        ceiling=Ceiling(budget=ROOT, depth=2, fanout=100_000),
        cell=CellSetup(cores=4, processing=2, coordination=1),
        keys=KeyStore(home),
        settings=Settings(),
    )
    with charter:
        for name in cells:  # 4 cores less up to 2 live peers: 2 slots per cell either way
            charter.configure_cell(CellSetup(cores=4, processing=2, coordination=1), name)
    return home


def _spawn(charter: Charter, width: int) -> None:
    spawn(charter, width, TRUE)  # bench/cell.py's fan-out: the same cost per worker


def _env(home: Path, state: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k != "CHARTER_DB"},
        "CHARTER_HOME": str(home),
        "PYTHONPATH": str(WT),
        "CHARTER_SANDBOX_STATE": str(state),
    }


def _cpu_s(pid: int) -> float:
    """A live process's user + system CPU seconds (its children's included once reaped)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / tick


def _cell_run(url: str, name: str, home: Path, state: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "charter", "--db", url, "--quiet", "cell", "run", "--id", name]
    argv += ["--ignore-host-load", "--slot-budget", SLOT]
    env = _env(home, state)
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def throughput(cells: list[str], workers: int, tmp: Path, state: Path) -> dict[str, float]:
    with scratch_database(ADMIN) as url:
        home = _home(url, cells, tmp)
        procs = [_cell_run(url, name, home, state) for name in cells]
        with Charter.open(url, keys=KeyStore(home)) as charter:
            journal = charter.journal
            while sum(e.type_name == "CellStarted" for e in journal.entries()) < len(cells):
                time.sleep(0.1)
            time.sleep(1.0)  # every cell parked its sandboxes
            first = (journal.head() or (0, b""))[0]
            _spawn(charter, workers)
            deadline = time.monotonic() + 900
            while True:
                ended = list(journal.entries(start=first + 1, types=("WorkerEnded",)))
                if len(ended) == workers or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            cpu = sum(_cpu_s(p.pid) for p in procs)
            history = list(journal.entries(start=first + 1))
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=120)
        with psycopg.connect(**pg_conninfo(url)) as conn:
            row = conn.execute(
                "SELECT count(*), sum(length(state)), "
                "count(DISTINCT substring(state from 1 for 40)) "
                "FROM charter_events WHERE notification_id > %s",
                (first,),
            ).fetchone()
    assert row is not None
    spawned = history[0].recorded_at
    last = max(e.recorded_at for e in history if isinstance(e.event, WorkerEnded))
    wall = (last - spawned).total_seconds()
    outcomes = [e.event.outcome for e in history if isinstance(e.event, WorkerEnded)]
    return {
        "cells": len(cells),
        "workers": workers,
        "wall_s": wall,
        "workers_per_s": workers / wall,
        "entries_per_worker": row[0] / workers,
        "bytes_per_worker": row[1] / workers,
        "commits_per_worker": row[2] / workers,  # distinct commit times: one per transaction
        "cell_cpu_ms_per_worker": cpu * 1000 / workers,
        "exited": float(sum(o == "exited" for o in outcomes)),
    }


class _Tick(Event):
    """The commit-rate bench's one small event (a standalone fact)."""

    type_name = "BenchTick"
    writer: int
    n: int


def _writer(url: str, n: int, ready: object, go: object, out: object) -> None:
    os.environ["CHARTER_GROUP_COMMIT"] = "off"
    with Journal.open(url, env={"GROUP_COMMIT": "off"}) as journal:
        ready.put(1)  # type: ignore[attr-defined]
        go.wait()  # type: ignore[attr-defined]
        t = time.monotonic()
        for i in range(n):
            journal.append([_Tick(writer=os.getpid(), n=i)])
        out.put(time.monotonic() - t)  # type: ignore[attr-defined]


def commit_rate(writers: int, n: int) -> float:
    ctx = multiprocessing.get_context("fork")
    with scratch_database(ADMIN) as url:
        Journal.create(url).close()
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_writer, args=(url, n, ready, go, out)) for _ in range(writers)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=60)
        t = time.monotonic()
        go.set()
        for _ in procs:
            out.get(timeout=600)
        wall = time.monotonic() - t
        for p in procs:
            p.join()
    return writers * n / wall


def _spawner(url: str, home: str, k: int, gap: float) -> None:
    with Charter.open(url, keys=KeyStore(Path(home))) as charter:
        for _ in range(k):
            _spawn(charter, 1)
            time.sleep(gap)


def wakeup(listen: bool, k: int, tmp: Path, state: Path) -> dict[str, float]:
    with scratch_database(ADMIN) as url:
        home = _home(url, ["w"], tmp / ("listen" if listen else "poll"))
        with Charter.open(url, keys=KeyStore(home)) as charter:
            charter.host_load = steady_load  # a shared machine's load would close the cell
            if not listen:
                charter.journal.listen = lambda _on: None  # type: ignore[method-assign,assignment]
            cell = Cell(charter, cell="w", budget=Budget.parse(SLOT), state_dir=state,
                        supervise=False)  # fmt: skip
            stop = threading.Event()
            cell.open()
            thread = threading.Thread(target=cell.run, kwargs={"until": stop.is_set})
            thread.start()
            time.sleep(2.0)
            idle0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            time.sleep(3.0)
            idle1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            ctx = multiprocessing.get_context("spawn")
            spawner = ctx.Process(target=_spawner, args=(url, str(home), k, 0.5))
            spawner.start()
            spawner.join()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                started = list(charter.journal.entries(types=("WorkerStarted",)))
                if len(started) == k:
                    break
                time.sleep(0.1)
            stop.set()
            thread.join()
            cell.close()
            history = list(charter.journal.entries())
    scheduled = {
        e.event.lineage: e.recorded_at for e in history if isinstance(e.event, WorkerScheduled)
    }
    lat = [
        (e.recorded_at - scheduled[e.event.lineage]).total_seconds() * 1000
        for e in history
        if isinstance(e.event, WorkerStarted)
    ]
    idle_cpu = (idle1.ru_utime + idle1.ru_stime - idle0.ru_utime - idle0.ru_stime) / (t1 - t0)
    return {
        "listen": listen,
        "p50_ms": percentile(lat, 0.5),
        "p90_ms": percentile(lat, 0.9),
        "idle_cpu_ms_per_s": idle_cpu * 1000,
        "n": len(lat),
    }


def model(three: dict[str, float], rate: float) -> dict[str, float]:
    """The projection to 10 hosts (one cell each) and 10,000 live workers, journal-bound:
    every worker costs ``commits_per_worker`` transactions of the one database, whose
    rate with writers on several hosts is ``rate`` (group commit is per host: measured
    here with 3 writer processes, group commit off). Besides the workers: 10 claims
    renewed every 5 s (a third of 15 s), and each live worker's ``WorkerSampled`` every
    2 s (docs/supervision.md, "Live burn"), one append each as the supervisor journals
    them today, or one per cell per pass if they were batched. Host-bound: 10 hosts of 2
    cores at the cells' CPU per worker."""
    commits = three["commits_per_worker"]
    renewals = 10 / 5
    sampled_today = 10_000 / 2
    sampled_batched = 10 / 2
    return {
        "db_commits_per_s": rate,
        "renewal_commits_per_s": renewals,
        "sample_commits_per_s_today": sampled_today,
        "sample_commits_per_s_batched": sampled_batched,
        "journal_bound_workers_per_s_batched": (rate - renewals - sampled_batched) / commits,
        "journal_headroom_today": rate / (renewals + sampled_today),
        "host_bound_workers_per_s": 10 * 2 * 1000 / three["cell_cpu_ms_per_worker"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=150)
    parser.add_argument("--latency", type=int, default=20)
    parser.add_argument("--appends", type=int, default=400)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-fabric-"))
    state = Path(tempfile.mkdtemp(prefix="bench-fabric-state-"))
    state.chmod(0o755)
    load = os.getloadavg()[0]
    one = throughput(["solo"], args.workers, tmp, state)
    three = throughput(["a", "b", "c"], args.workers, tmp, state)
    rates = {w: commit_rate(w, args.appends) for w in (1, 3)}
    listen = wakeup(True, args.latency, tmp, state)
    poll = wakeup(False, args.latency, tmp, state)
    result = {
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "one_cell": one,
        "three_cells": three,
        "ratio_three_to_one": three["workers_per_s"] / one["workers_per_s"],
        "db_commits_per_s": rates,
        "listen": listen,
        "poll": poll,
        "model": model(three, rates[3]),
    }
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
