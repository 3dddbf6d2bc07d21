"""Journal benchmarks: chained appends against the stock eventsourcing recorder, raw
drivers as the physical reference, and full-chain verification of 1,000,000 entries.

Every ratio is measured in this run on this machine. Targets (issue 2):
  chained / stock >= 0.85 for single-event and 1000-event appends, SQLite and PostgreSQL;
  verify 1,000,000 SQLite entries in <= 5 s.
Target (issue 11): 16 concurrent writer processes append at least as many entries/s in
  aggregate as one writer (process start-up excluded), on each backend; printed beside
  the raw driver's rates for 1 and 16 writers of the same run.
Run: python3 bench/journal.py [--pg URL] [--skip-pg] [--rounds N] [--verify-n N]
       [--writers N] [--per-writer K] [--writers-only]
Exit status 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._support import pg_conninfo, scratch_database
from charter.audit.journal import audit_journal
from charter.core import Event
from charter.ledger import Journal
from charter.ledger._app import Envelope, JournalApplication, now

SINGLE = 1500  # single-event commits per round
SINGLE_BLOCKS = 15  # run in alternating blocks of 100 per path
BATCHES = 20  # 1000-event commits per round


class BenchEvent(Event):
    type_name = "BenchEvent"
    worker: str
    n: int
    note: str


def _event(i: int) -> BenchEvent:
    # ~240 B of canonical JSON, like a grant or lease event
    return BenchEvent(worker=f"agent:root/sa-{i:06d}", n=i, note="x" * 150)


def _interleaved(
    paths: dict[str, Callable[[int], None]], blocks: int, per_block: int
) -> dict[str, float]:
    """events/s of each path, run in alternating blocks (block ``b`` of every path
    before block ``b + 1`` of any), so a slow spell of the machine hits every path
    alike instead of whichever happened to be running."""
    spent = dict.fromkeys(paths, 0.0)
    for b in range(blocks):
        for name, fn in paths.items():
            t = time.perf_counter()
            fn(b)
            spent[name] += time.perf_counter() - t
    return {name: blocks * per_block / s for name, s in spent.items()}


def _round(
    chained: Journal,
    stock: JournalApplication,
    raw_one: Callable[[], None],
    raw_batch: Callable[[], None],
) -> dict[str, float]:
    """One round of all six paths; every path writes the same events."""
    block = SINGLE // SINGLE_BLOCKS

    def one_chained(b: int) -> None:
        for i in range(b * block, (b + 1) * block):
            chained.append([_event(i)])

    def one_stock(b: int) -> None:
        for i in range(b * block, (b + 1) * block):
            stock.save(Envelope(uuid.uuid4(), 1, now(), _event(i)))

    def one_raw(b: int) -> None:
        del b
        for _ in range(block):
            raw_one()

    def batch_chained(b: int) -> None:
        chained.append([_event(b * 1000 + i) for i in range(1000)])

    def batch_stock(b: int) -> None:
        at = now()
        stock.save(*(Envelope(uuid.uuid4(), 1, at, _event(b * 1000 + i)) for i in range(1000)))

    def batch_raw(b: int) -> None:
        del b
        raw_batch()

    single = _interleaved(
        {"single stock": one_stock, "single chained": one_chained, "single raw": one_raw},
        SINGLE_BLOCKS,
        block,
    )
    batch = _interleaved(
        {"batch stock": batch_stock, "batch chained": batch_chained, "batch raw": batch_raw},
        BATCHES,
        1000,
    )
    return single | batch


_STATE = _event(0).model_dump_json().encode()
_RAW_TABLE = (
    "CREATE TABLE e ({} , originator_version bigint, topic text, state {}, "
    "PRIMARY KEY (originator_id, originator_version))"
)


def bench_sqlite(tmp: Path, rounds: int) -> list[dict[str, float]]:
    """Chained vs the library's stock SQLite recorder vs raw sqlite3 (WAL, FULL)."""
    results = []
    for r in range(rounds):
        chained = Journal.create(f"sqlite:///{tmp / f'chained{r}.db'}")
        stock = JournalApplication(
            env={
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": str(tmp / f"stock{r}.db"),
                "CREATE_TABLE": "yes",
            }
        )
        raw = sqlite3.connect(tmp / f"raw{r}.db", isolation_level=None)
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA synchronous=FULL")
        raw.execute(_RAW_TABLE.format("originator_id text", "blob"))
        insert = "INSERT INTO e VALUES (?,?,?,?)"

        def raw_one(raw: sqlite3.Connection = raw, insert: str = insert) -> None:
            raw.execute("BEGIN")
            raw.execute(insert, (uuid.uuid4().hex, 1, "BenchEvent/v1", _STATE))
            raw.execute("COMMIT")

        def raw_batch(raw: sqlite3.Connection = raw, insert: str = insert) -> None:
            raw.execute("BEGIN")
            raw.executemany(
                insert, [(uuid.uuid4().hex, 1, "BenchEvent/v1", _STATE) for _ in range(1000)]
            )
            raw.execute("COMMIT")

        results.append(_round(chained, stock, raw_one, raw_batch))
        chained.close()
        stock.close()
        raw.close()
    return results


def bench_postgres(admin_url: str, rounds: int) -> list[dict[str, float]]:
    """Chained vs the library's stock PostgreSQL recorder vs raw psycopg."""
    results = []
    for _ in range(rounds):
        with scratch_database(admin_url) as url:
            results.append(_postgres_round(url))
    return results


def _postgres_round(url: str) -> dict[str, float]:
    info = pg_conninfo(url)
    name = info["dbname"]
    chained = Journal.create(url)

    class Stock(JournalApplication):
        name = "stock"  # its own table, stock_events, in the same database

    stock = Stock(
        env={
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": name,
            "POSTGRES_HOST": str(info["host"]),
            "POSTGRES_PORT": str(info["port"]),
            "POSTGRES_USER": str(info["user"]),
            "POSTGRES_PASSWORD": str(info.get("password") or ""),
            "POSTGRES_POOL_SIZE": "1",
            "CREATE_TABLE": "yes",
        }
    )
    raw = psycopg.connect(**info)
    raw.execute(_RAW_TABLE.format("originator_id uuid", "bytea"))
    raw.commit()
    insert = "INSERT INTO e VALUES (%s,%s,%s,%s)"

    def raw_one(raw: psycopg.Connection[Any] = raw, insert: str = insert) -> None:
        raw.execute(insert, (uuid.uuid4(), 1, "BenchEvent/v1", _STATE))
        raw.commit()

    def raw_batch(raw: psycopg.Connection[Any] = raw, insert: str = insert) -> None:
        with raw.cursor() as cur:
            cur.executemany(
                insert, [(uuid.uuid4(), 1, "BenchEvent/v1", _STATE) for _ in range(1000)]
            )
        raw.commit()

    result = _round(chained, stock, raw_one, raw_batch)
    chained.close()
    stock.close()
    raw.close()
    return result


# -- verification ----------------------------------------------------------------


def bench_verify(tmp: Path, n: int) -> tuple[float, float, int]:
    """Seconds to verify ``n`` entries, seconds of sha256 over the same stored bytes."""
    url = f"sqlite:///{tmp / 'verify.db'}"
    with Journal.create(url) as j:
        t = time.perf_counter()
        for b in range(n // 1000):
            j.append([_event(b * 1000 + i) for i in range(1000)])
        print(f"  (populated {n:,} entries in {time.perf_counter() - t:.1f} s)", file=sys.stderr)
    with Journal.open(url) as j:
        t = time.perf_counter()
        report = audit_journal(j)
        verify_s = time.perf_counter() - t
        if not report.ok or report.checked != n:
            raise SystemExit(f"verification failed: {report}")
        blobs: list[bytes] = []
        for batch in j.batches():
            for _pos, oid, _ver, topic, state, prev, chain in batch:
                blobs.append(b"".join((oid.encode(), topic.encode(), state, prev, chain)))
        total = sum(map(len, blobs))
        t = time.perf_counter()
        h = hashlib.sha256()
        for blob in blobs:
            h.update(blob)
        sha_s = time.perf_counter() - t
    return verify_s, sha_s, total


# -- concurrent writers ----------------------------------------------------------------


def _raw_appender(url: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    """One single-row commit through the bare driver (no chain, no lock of ours)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=30)
        conn.execute("PRAGMA synchronous=FULL")

        def one(i: int) -> None:
            del i
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO e VALUES (?,?,?,?)", (uuid.uuid4().hex, 1, "B/v1", _STATE))
            conn.execute("COMMIT")

        return one, conn.close
    pconn = psycopg.connect(**pg_conninfo(url), autocommit=True)

    def one_pg(i: int) -> None:
        del i
        pconn.execute("INSERT INTO e VALUES (%s,%s,%s,%s)", (uuid.uuid4(), 1, "B/v1", _STATE))

    return one_pg, pconn.close


def _chained_appender(url: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    journal = Journal.open(url)

    def one(i: int) -> None:
        journal.append([_event(i)])

    return one, journal.close


def _writer_process(url: str, kind: str, per: int, barrier: Any, out: Any) -> None:
    """Open (start-up, not timed), wait for every writer, then ``per`` commits."""
    one, close = _chained_appender(url) if kind == "chained" else _raw_appender(url)
    one(-1)  # warm: connection, pool, prepared statements
    barrier.wait()
    t0 = time.perf_counter()
    for i in range(per):
        one(i)
    out.put((t0, time.perf_counter(), per))
    close()


def _aggregate(url: str, kind: str, writers: int, per: int) -> float:
    """Entries/s of ``writers`` processes appending at once: all entries over the span
    from the first writer's start to the last one's end (start-up excluded)."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    procs = [
        ctx.Process(target=_writer_process, args=(url, kind, per, barrier, out))
        for _ in range(writers)
    ]
    for p in procs:
        p.start()
    spans = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise SystemExit(f"a {kind} writer failed (exit {p.exitcode})")
    start, end = min(s[0] for s in spans), max(s[1] for s in spans)
    return float(sum(s[2] for s in spans) / (end - start))


def bench_writers(url: str, writers: int, per: int, rounds: int) -> dict[str, float]:
    """Chained and raw, 1 writer and ``writers`` writers, on one journal's backend: the
    median of ``rounds`` rounds, the four runs of a round back to back (so a slow spell
    of a shared machine hits 1 and ``writers`` writers alike)."""
    Journal.create(url).close()
    if url.startswith("sqlite"):
        raw = sqlite3.connect(url.removeprefix("sqlite:///") + ".raw", isolation_level=None)
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute(_RAW_TABLE.format("originator_id text", "blob"))
        raw.close()
        raw_url = url + ".raw"
    else:
        with psycopg.connect(**pg_conninfo(url), autocommit=True) as raw_pg:
            raw_pg.execute(_RAW_TABLE.format("originator_id uuid", "bytea"))
        raw_url = url
    total = writers * per
    runs = [
        {
            "chained 1": _aggregate(url, "chained", 1, total),
            f"chained {writers}": _aggregate(url, "chained", writers, per),
            "raw 1": _aggregate(raw_url, "raw", 1, total),
            f"raw {writers}": _aggregate(raw_url, "raw", writers, per),
        }
        for _ in range(rounds)
    ]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _report_writers(backend: str, r: dict[str, float], writers: int, failures: list[str]) -> None:
    one, many = r["chained 1"], r[f"chained {writers}"]
    ratio = many / one
    ok = ratio >= 1.0
    print(
        f"\n{backend}: single-event commits, entries/s (start-up excluded; median of rounds)\n"
        f"  chained  1 writer {one:>9,.0f}   {writers} writers {many:>9,.0f}   "
        f"{writers}/1 = {ratio:.2f} (target >= 1.00) {'PASS' if ok else 'FAIL'}\n"
        f"  raw      1 writer {r['raw 1']:>9,.0f}   {writers} writers "
        f"{r[f'raw {writers}']:>9,.0f}   {writers}/1 = {r[f'raw {writers}'] / r['raw 1']:.2f}"
    )
    if not ok:
        failures.append(f"{backend} {writers} writers: {ratio:.2f}x one writer < 1.00")


def _report(backend: str, rounds: list[dict[str, float]], failures: list[str]) -> None:
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"\n{backend}: events/s (median of {len(rounds)} rounds)")
    for kind in ("single", "batch"):
        stock, chained, raw = (med[f"{kind} {x}"] for x in ("stock", "chained", "raw"))
        ratio = chained / stock
        ok = ratio >= 0.85
        label = "single-event commits" if kind == "single" else "1000-event commits"
        print(
            f"  {label:<21} chained {chained:>9,.0f}  stock {stock:>9,.0f}  "
            f"raw {raw:>9,.0f}   chained/stock {ratio:.2f} (target >= 0.85) "
            f"{'PASS' if ok else 'FAIL'}   chained/raw {chained / raw:.2f}"
        )
        if not ok:
            failures.append(f"{backend} {label}: chained/stock {ratio:.2f} < 0.85")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--skip-pg", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--verify-n", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--per-writer", type=int, default=500)
    parser.add_argument("--writers-only", action="store_true")
    args = parser.parse_args()
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="charter-bench-") as d:
        tmp = Path(d)
        n, per = args.writers, args.per_writer
        sqlite_rates = bench_writers(f"sqlite:///{tmp / 'w.db'}", n, per, args.rounds)
        _report_writers("SQLite", sqlite_rates, n, failures)
        if not args.skip_pg:
            with scratch_database(args.pg) as url:
                pg_rates = bench_writers(url, n, per, args.rounds)
                _report_writers("PostgreSQL", pg_rates, n, failures)
        if args.writers_only:
            for f in failures:
                print(f"MISSED: {f}", file=sys.stderr)
            return 1 if failures else 0
        _report("SQLite", bench_sqlite(tmp, args.rounds), failures)
        if not args.skip_pg:
            _report("PostgreSQL", bench_postgres(args.pg, args.rounds), failures)
        verify_s, sha_s, total = bench_verify(tmp, args.verify_n)
    ok = verify_s <= 5.0
    print(
        f"\nverify {args.verify_n:,} SQLite entries: {verify_s:.2f} s "
        f"({args.verify_n / verify_s:,.0f} entries/s; target <= 5 s) {'PASS' if ok else 'FAIL'}"
        f"\n  sha256 over the same {total / 1e6:.0f} MB of stored bytes: {sha_s:.2f} s; "
        f"verify/sha256 = {verify_s / sha_s:.1f}x"
    )
    if not ok:
        failures.append(f"verify took {verify_s:.2f} s > 5 s")
    for f in failures:
        print(f"MISSED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

_unused: Any = None
