"""Benchmark: the start-up cost of the ``charter`` command's help and completion, as a
multiple of a bare interpreter start (``python -c pass``) measured in the same rounds.

    python3 bench/cli.py [--runs 9]

For the root ``--help``, every command's ``--help`` and a completion (options of
``tree``): the median CPU time (user + system, which does not grow with other load on
the machine) and the median wall time of ``--runs`` interleaved runs, after one run
that writes the bytecode (as an installation does).

Exits 1 if any CPU-time ratio is above 2 (docs/cli.md: at most about twice a bare
start).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._support import env as _env  # noqa: E402
from charter.cli._main import _COMMANDS  # noqa: E402

LIMIT = 2.0
_COMPLETE = {
    "_CHARTER_COMPLETE": "bash_complete",
    "COMP_WORDS": "charter tree --st",
    "COMP_CWORD": "2",
}


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds and wall seconds of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False, cwd=ROOT, env=env, timeout=60)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    runs = parser.parse_args().runs
    charter = [sys.executable, "-c", "import sys; sys.argv[0] = 'charter'; "
               "from charter.cli import main; main()"]  # fmt: skip
    cases: dict[str, tuple[list[str], dict[str, str]]] = {
        "charter --help": ([*charter, "--help"], _env()),
        **{f"charter {name} --help": ([*charter, name, "--help"], _env()) for name in _COMMANDS},
        "complete: charter tree --st": (charter, _env(_COMPLETE)),
    }
    bare = ([sys.executable, "-c", "pass"], _env())
    worst = 0.0
    print(f"{'case':<34} {'cpu ×':>6} {'wall ×':>7}")
    for name, (argv, env) in cases.items():
        _run(argv, env)  # bytecode
        base: list[tuple[float, float]] = []
        mine: list[tuple[float, float]] = []
        for _ in range(runs):
            base.append(_run(*bare))
            mine.append(_run(argv, env))
        cpu = statistics.median(c for c, _ in mine) / statistics.median(c for c, _ in base)
        wall = statistics.median(w for _, w in mine) / statistics.median(w for _, w in base)
        worst = max(worst, cpu)
        print(f"{name:<34} {cpu:>6.2f} {wall:>7.2f}")
    print(f"worst CPU-time ratio {worst:.2f} (limit {LIMIT})")
    return 1 if worst > LIMIT else 0


if __name__ == "__main__":
    sys.exit(main())
