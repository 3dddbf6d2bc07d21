"""Benchmark: the 16-writer mixed load's throughput with settled time and without it.

Sixteen mixer processes (tests/budgets/_mixer.py, the mixed-load test's, unpaced: each
decides as fast as it can) fan out, record usage, release, renew and let leases expire
on one fresh journal for ``--seconds``; the same load with the settled-time rule
switched off in the mixers (test side: every expiry final at once, as before the rule)
is measured in the same run, the rounds alternated. Throughput is the appends committed
per second (the journal's entries after the setup, over the load's wall time) and the
mixers' decisions per second (committed or refused).

    python3 bench/mixed.py [--backend sqlite|postgres|both] [--seconds 30] [--rounds 2]
        [--ratio 1.2] [--pg URL]

Prints each round and the ratio of the medians (without / with); exits 1 if the rule
costs more than ``--ratio`` in committed appends per second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._support import scratch_database
from charter.control import register_root
from charter.core import KeyStore
from charter.ledger import Journal
from tests.budgets._load import PROCESSES, Load
from tests.budgets._support import ceiling

DECISIONS = ("spawns", "usages", "releases", "renewals", "refused")


def one_round(url: str, home: Path, seconds: float, rule: bool) -> tuple[float, float]:
    """(appends committed per second, decisions per second) of one load."""
    with Journal.create(url) as journal:
        register_root(journal, KeyStore(home), "root", ceiling(fanout=1_000_000))
        before = (journal.head() or (0,))[0]
    env = {"CHARTER_MIXER_UNPACED": "1"}
    if not rule:
        env["CHARTER_MIXER_NO_SETTLED_TIME"] = "1"
    load = Load(url, home, seconds, env=env)
    load.run()
    if load.failures:
        raise SystemExit("\n".join(load.failures))
    with Journal.open(url) as journal:
        after = (journal.head() or (0,))[0]
    decisions = sum(load.totals[k] for k in DECISIONS)
    return (after - before) / load.ran, decisions / load.ran


def run(backend: str, args: argparse.Namespace) -> bool:
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i in range(args.rounds):
        for rule in (True, False) if i % 2 == 0 else (False, True):
            with tempfile.TemporaryDirectory() as d:
                tmp = Path(d)
                if backend == "sqlite":
                    url = f"sqlite:///{tmp / 'j.db'}"
                    result = one_round(url, tmp / "home", args.seconds, rule)
                else:
                    with scratch_database(args.pg) as url:
                        result = one_round(url, tmp / "home", args.seconds, rule)
            results[rule].append(result)
            name = "with settled time" if rule else "without (every expiry final)"
            print(
                f"  {backend} round {i + 1}, {name}: {result[0]:.1f} appends/s, "
                f"{result[1]:.1f} decisions/s",
                flush=True,
            )
    with_a = statistics.median(r[0] for r in results[True])
    without_a = statistics.median(r[0] for r in results[False])
    with_d = statistics.median(r[1] for r in results[True])
    without_d = statistics.median(r[1] for r in results[False])
    ratio = without_a / with_a
    met = ratio <= float(args.ratio)
    print(
        f"{PROCESSES} writers on {backend}, {args.seconds:.0f} s a round, {args.rounds} "
        f"rounds each: with settled time {with_a:.1f} appends/s ({with_d:.1f} decisions/s), "
        f"without {without_a:.1f} appends/s ({without_d:.1f} decisions/s); "
        f"without / with: {ratio:.2f}x appends, {without_d / with_d:.2f}x decisions "
        f"(target <= {args.ratio}x): {'met' if met else 'MISSED'}"
    )
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ratio", type=float, default=1.2)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    met = [run(backend, args) for backend in backends]  # every backend, even after a miss
    return 0 if all(met) else 1


if __name__ == "__main__":
    sys.exit(main())
