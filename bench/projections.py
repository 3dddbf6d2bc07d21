"""Benchmark: projection rebuild rate and incremental lag, beside the library's own
aggregate replay measured in the same run.

    python3 bench/projections.py [--events 200000] [--runs 3] [--lag-commits 400]
                                 [--pg postgresql://postgres@127.0.0.1:5432/test]

1. Populates a SQLite journal with a fan-out workload (grants, leases, admissions,
   usage, renewals, releases, slot releases; depth 2).
2. Rebuild from zero (``Projector.rebuild``): events/s, best of --runs.
3. Library replay, same journal: the eventsourcing notification log read in sections
   of 1000, ``mapper.to_domain_event`` (decode) and a fold into LeaseBook + Cells
   (mutate): events/s. Beside it, the library's own aggregate replay (the figure the
   eventsourcing notes give, ~86k/s): a stock application with as many events in
   10-event aggregates, read, decoded and mutated into every aggregate.
4. Incremental lag: a follower process (``Projector.follow``) while single-entry
   commits arrive every ~10 ms; lag = follower's commit of position p minus the
   append's return for p (CLOCK_MONOTONIC, shared by both processes); p50/p99.

Exits 1 if rebuild < 150k events/s on SQLite or lag p99 > 50 ms.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from bench._support import percentile, scratch_database
from charter.authority import AgentRegistered, GrantMinted
from charter.budgets import (
    BudgetLedgerOpened,
    CellConfigured,
    Cells,
    LeaseBook,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    ResourceClass,
    SlotAdmitted,
    SlotReleased,
    UsageRecorded,
)
from charter.core import Budget, Event, entry_ms
from charter.ledger import Journal
from charter.projections import Projector

REBUILD_TARGET = 150_000
LAG_TARGET_MS = 50.0
_BODY = "x" * 420
_SIG = "ab" * 64


def _b(n: int) -> Budget:
    return Budget(tokens=n, wall_ms=n, cpu_ms=n, mem_bytes=n, egress_bytes=n)


def workload(events: int) -> list[list[Event]]:
    """Batches (one append each): every fan-out of 10 is spawned, used, partly
    re-spawned one level deeper, renewed, released and its slots given back."""
    root = "agent:root"
    batches: list[list[Event]] = [
        [
            AgentRegistered(name="root", lineage=root, trust_root="cd" * 32),
            BudgetLedgerOpened(lineage=root, allocation=_b(10**15)),
            CellConfigured(
                cell="c1", caps=dict.fromkeys(ResourceClass, 10**6), cores=64, failover_reserve=2
            ),
        ]
    ]
    count, n, far = 3, 0, 4_102_444_800_000
    while count < events:
        n += 1
        kids = [f"{root}/sa-{n:x}x{i}" for i in range(10)]
        grand = [f"{kids[0]}/sa-{n:x}g{i}" for i in range(3)]
        spawn: list[Event] = []
        for parent, lineages in ((root, kids), (kids[0], grand)):
            spawn += [
                GrantMinted(fanout=f"f{n}", lineage=c, issuer=parent, body=_BODY, signature=_SIG)
                for c in lineages
            ]
            spawn += [
                LeaseGranted(lineages=(c,), parent=parent, allocation=_b(1000), expires_at_ms=far)
                for c in lineages
            ]
            spawn += [
                SlotAdmitted(
                    cell="c1", lineage=c, resource=ResourceClass.PROCESSING, cap=10**6, occupancy=1
                )
                for c in lineages
            ]
        end: list[Event] = []
        for c in [*grand, *kids]:
            end.append(UsageRecorded(lineage=c, amount=_b(7), refused=_b(0), exhausted=False))
            end.append(UsageRecorded(lineage=c, amount=_b(5), refused=_b(0), exhausted=False))
        end.append(LeaseRenewed(lineage=kids[1], parent=root, expires_at_ms=far + 1))
        end += [LeaseReleased(lineage=c) for c in kids]
        end += [
            SlotReleased(cell="c1", lineage=c, resource=ResourceClass.PROCESSING)
            for c in [*kids, *grand]
        ]
        batches += [spawn, end]
        count += len(spawn) + len(end)
    return batches


def _replay(app: Any, fold: Callable[[Any], None]) -> tuple[int, float]:
    """Every domain event of ``app``, read through the notification log in sections of
    1000 and decoded by its mapper, handed to ``fold``; (events, seconds)."""
    t0 = time.perf_counter()
    start, done = 1, 0
    while True:
        notifications = app.recorder.select_notifications(start=start, limit=1000)
        if not notifications:
            break
        for notification in notifications:
            fold(app.mapper.to_domain_event(notification))
        done += len(notifications)
        start = notifications[-1].id + 1
    return done, time.perf_counter() - t0


def library_replay(journal: Journal) -> tuple[int, float]:
    """Read + decode + mutate through eventsourcing (notification log, mapper, folds)."""
    book, cells = LeaseBook(), Cells()

    def fold(envelope: Any) -> None:
        book.apply(envelope.event, entry_ms(envelope.timestamp))
        cells.apply(envelope.event)

    return _replay(journal.application, fold)


class Tally(Aggregate):
    """A plain library aggregate: opened once, then counted (dataclass events)."""

    @event("Opened")
    def __init__(self, name: str) -> None:
        self.name = name
        self.total = 0

    @event("Counted")
    def count(self, amount: int) -> None:
        self.total += amount


def library_aggregate_replay(tmp: Path, events: int) -> tuple[int, float]:
    """The library's own aggregate replay, as measured in the eventsourcing notes: a
    stock SQLite application holding aggregates of 10 events each, read back through
    the notification log, decoded by the mapper and mutated into every aggregate."""
    env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(tmp / "agg.db")}
    with Application[uuid.UUID](env=env) as app:
        made = 0
        while made < events:
            batch = []
            for _ in range(100):  # 1000 events per commit
                tally = Tally(name="t")
                for _ in range(9):
                    tally.count(amount=1)
                batch.append(tally)
            app.save(*batch)
            made += 1000
        aggregates: dict[Any, Any] = {}

        def mutate(domain_event: Any) -> None:
            oid = domain_event.originator_id
            aggregates[oid] = domain_event.mutate(aggregates.get(oid))

        return _replay(app, mutate)


_FOLLOWER = """
import sys, time
from charter.core.clock import entry_ms
from charter.ledger.journal import Journal
from charter.projections import Projector
with Journal.open(sys.argv[1]) as journal, Projector(journal, "lag") as projector:
    projector.catch_up()
    print("ready", flush=True)
    projector.follow(poll_s=0.001, on_step=lambda p: print(p, time.monotonic(), flush=True))
"""


def lag(url: str, commits: int) -> list[float]:
    follower = subprocess.Popen(
        [sys.executable, "-c", _FOLLOWER, url], stdout=subprocess.PIPE, text=True
    )
    assert follower.stdout is not None
    if follower.stdout.readline().strip() != "ready":
        raise SystemExit("follower did not start")
    committed: list[tuple[int, float]] = []
    with Journal.open(url) as journal:
        for i in range(commits):
            (c,) = journal.append(
                [UsageRecorded(lineage="agent:root", amount=_b(1), refused=_b(0), exhausted=False)]
            )
            committed.append((c.position, time.monotonic()))
            time.sleep(0.005 + (i % 7) * 0.001)
        last = committed[-1][0]
        reports: list[tuple[int, float]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            reported, when = follower.stdout.readline().split()
            reports.append((int(reported), float(when)))
            if int(reported) >= last:
                break
    follower.kill()
    follower.wait()
    lags, j = [], 0
    for position, at in committed:
        while reports[j][0] < position:
            j += 1
        lags.append((reports[j][1] - at) * 1000)
    return lags


def rebuild_rate(url: str, runs: int) -> tuple[int, float]:
    with Journal.open(url) as journal, Projector(journal, "bench") as projector:
        rows = sum(len(b) for b in journal.batches())
        best = min(_timed(projector.rebuild) for _ in range(runs))
    return rows, best


def _timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def populate(url: str, events: int) -> int:
    Journal.create(url).close()
    with Journal.open(url) as journal:
        for batch in workload(events):
            journal.append(batch)
        head = journal.head()
    return 0 if head is None else head[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lag-commits", type=int, default=400)
    parser.add_argument("--pg", default=None, help="also measure on PostgreSQL (admin URL)")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'journal.db'}"
        t0 = time.perf_counter()
        head = populate(url, args.events)
        print(f"sqlite: populated {head} events in {time.perf_counter() - t0:.1f}s")
        rows, secs = rebuild_rate(url, args.runs)
        rate = rows / secs
        with Journal.open(url) as journal:
            done, lib_secs = library_replay(journal)
        lib_rate = done / lib_secs
        print(
            f"sqlite: rebuild from zero      {rate:>10,.0f} events/s  ({rows} in {secs:.2f}s, "
            f"best of {args.runs}; target >= {REBUILD_TARGET:,})"
        )
        print(
            f"sqlite: library replay         {lib_rate:>10,.0f} events/s  ({done} in "
            f"{lib_secs:.2f}s: notification log + mapper + LeaseBook/Cells)"
        )
        print(f"sqlite: ratio rebuild/library  {rate / lib_rate:>10.2f}x")
        agg_done, agg_secs = library_aggregate_replay(Path(tmp), args.events)
        agg_rate = agg_done / agg_secs
        print(
            f"sqlite: library aggregate replay {agg_rate:>8,.0f} events/s  ({agg_done} in "
            f"{agg_secs:.2f}s: stock app, 10-event aggregates, log + mapper + mutate; "
            f"rebuild is {rate / agg_rate:.2f}x)"
        )
        ok &= rate >= REBUILD_TARGET
        lags = lag(url, args.lag_commits)
        p50, p99 = statistics.median(lags), percentile(lags, 0.99)
        print(
            f"sqlite: incremental lag        p50 {p50:.1f} ms  p99 {p99:.1f} ms  max "
            f"{max(lags):.1f} ms  ({len(lags)} commits; target p99 <= {LAG_TARGET_MS:.0f} ms)"
        )
        ok &= p99 <= LAG_TARGET_MS
    if args.pg:
        with scratch_database(args.pg) as url:
            populate(url, args.events)
            rows, secs = rebuild_rate(url, args.runs)
            with Journal.open(url) as journal:
                done, lib_secs = library_replay(journal)
            print(
                f"postgres: rebuild from zero    {rows / secs:>10,.0f} events/s  "
                f"(library replay {done / lib_secs:,.0f}/s; ratio "
                f"{(rows / secs) / (done / lib_secs):.2f}x)"
            )
            lags = lag(url, args.lag_commits)
            p99 = percentile(lags, 0.99)
            print(
                f"postgres: incremental lag      p50 {statistics.median(lags):.1f} ms  "
                f"p99 {p99:.1f} ms  max {max(lags):.1f} ms"
            )
            ok &= p99 <= LAG_TARGET_MS
    print("PASS" if ok else "FAIL: a target was missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
