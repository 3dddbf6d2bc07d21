"""Honeytoken touch-to-detection latency: a worker in a real warm-pool sandbox opens its
decoy credential file N times; the time from each open (the worker's CLOCK_MONOTONIC,
which a sandbox shares with the host) to the moment ``CanaryWatch`` reads the event.

Baseline, same run: the same watcher on a plain host tmpfs file opened N times by a host
process (raw inotify with nothing of the sandbox in between). Target: p99 <= 1 s.

Run as root: ``python3 bench/canary_watch.py [--touches N]``. Exits 1 if the target is
missed. This measures detection only: the verdict's append and the kill that follow are
the cell's (not wired yet; see docs/supervision.md).
"""

from __future__ import annotations

import argparse
import queue
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from charter.core import Budget
from charter.sandbox import CanaryWatch, DecoyTouch, WarmPool, plant_decoy
from charter.supervision import canaries_for

PY = "/usr/bin/python3"
TOUCH = r"""
import sys, time
path, n = sys.argv[1], int(sys.argv[2])
for _ in range(n):
    t = time.monotonic()
    with open(path) as f:
        f.read()
    print(repr(t), flush=True)
    time.sleep(0.02)
"""


def _opens(seen: queue.Queue[DecoyTouch], n: int) -> list[float]:
    out: list[float] = []
    while len(out) < n:
        touch = seen.get(timeout=5)
        if touch.kind == "open":
            out.append(touch.seen)
    return out


def _ms(seen_at: list[float], opened: list[float]) -> list[float]:
    return sorted((s - o) * 1000 for s, o in zip(seen_at, opened, strict=True))


def _p(lat: list[float], q: float) -> float:
    return lat[min(len(lat) - 1, round(q * (len(lat) - 1)))]


def host_baseline(watch: CanaryWatch, seen: queue.Queue[DecoyTouch], n: int) -> list[float]:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        path = Path(d) / "decoy.ini"
        path.write_text("x")
        wd = watch.watch("host", path, once=False)
        done = subprocess.run([PY, "-I", "-c", TOUCH, str(path), str(n)],
                              capture_output=True, text=True, check=True)  # fmt: skip
        opened = [float(x) for x in done.stdout.split()]
        lat = _ms(_opens(seen, n), opened)
        watch.unwatch(wd)
        return lat


def sandboxed(watch: CanaryWatch, seen: queue.Queue[DecoyTouch], n: int) -> list[float]:
    budget = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=64MiB,egress=0MB")
    with tempfile.TemporaryDirectory() as t:
        Path(t).chmod(0o755)
        with WarmPool(Path(t), budget, capacity=1, parked=0) as pool:
            slot = pool.lease()
            try:
                canaries = canaries_for(slot.sandbox_id, secrets.token_bytes(16))
                text = canaries.credential_text()
                with plant_decoy(slot.spec, canaries.credential_file, text) as d:
                    watch.watch("sbx", d, once=False)
                inside = f"/workspace/{canaries.credential_file}"
                outcome = slot.run([PY, "-I", "-c", TOUCH, inside, str(n)])
                if outcome.exit_code != 0:
                    raise SystemExit(f"the worker failed: {outcome.stderr!r}")
                opened = [float(x) for x in (outcome.stdout or b"").decode().split()]
                return _ms(_opens(seen, n), opened)
            finally:
                pool.release(slot, refill=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--touches", type=int, default=50)
    args = parser.parse_args()
    seen: queue.Queue[DecoyTouch] = queue.Queue()
    with CanaryWatch(seen.put) as watch:
        base = host_baseline(watch, seen, args.touches)
        sbx = sandboxed(watch, seen, args.touches)
    for name, lat in (("host file, host process (baseline)", base), ("sandbox decoy", sbx)):
        print(f"{name:38s} n={len(lat)} p50 {statistics.median(lat):7.3f} ms  "
              f"p99 {_p(lat, 0.99):7.3f} ms  max {lat[-1]:7.3f} ms")  # fmt: skip
    ratio = statistics.median(sbx) / statistics.median(base)
    print(f"ratio of medians (sandbox / baseline): {ratio:.2f}")
    ok = _p(sbx, 0.99) <= 1000
    print(f"target p99 <= 1000 ms: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
