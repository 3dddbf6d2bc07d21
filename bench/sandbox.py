"""Sandbox latency benchmarks; baselines are measured in the same run, interleaved.

1. Cold start-to-exit of ``true``: ``Launcher.run`` from the call until it returns the
   outcome (uid allocation, spec, cgroups made and joined, seccomp, bwrap, usage read,
   every sandbox process gone) against a bare bubblewrap run with the same flags (the
   same rendered argv and fds, a private tmpfs workspace, ``Popen(user=…)``, no
   cgroups). The empty cgroup directories are removed afterwards on the janitor thread,
   drained between iterations outside the timed region. Target: ratio of medians <= 1.3.
2. Warm-pool lease-to-exit p50: ``pool.lease()`` + ``slot.run(["/bin/true"])`` (exit code
   and usage known) against a plain fork/exec of ``/bin/true`` (``subprocess.run``).
   Target: ratio of medians <= 5. Release and refill happen outside the timed region.

Run as root: ``python3 bench/sandbox.py [--runs N]``. Exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from charter.core import Budget
from charter.sandbox import (
    BwrapFds,
    HostFacts,
    Launcher,
    WarmPool,
    compile_spec,
    render_bwrap,
    render_seccomp,
)
from charter.sandbox import _janitor as janitor
from charter.sandbox._proc import _memfd

BUDGET = Budget.parse("tokens=1k,wall=10s,cpu=10s,mem=256MiB,egress=0MB")
BARE_UID = 60_999  # outside the launcher's round-robin start, held by no sandbox here
COLD_TARGET, WARM_TARGET = 1.3, 5.0


def _ms(f: object) -> float:
    t = time.perf_counter()
    f()  # type: ignore[operator]
    return (time.perf_counter() - t) * 1000


def cold(runs: int) -> tuple[float, float]:
    launcher = Launcher()
    # No --workspace, as the launcher's runs: the same private tmpfs workspace flags.
    spec = compile_spec(
        BUDGET,
        HostFacts(
            sandbox_id="bench", host_uid=BARE_UID, host_gid=BARE_UID, workspace=None,
            host_cpus=os.cpu_count() or 1,
        ),
    )  # fmt: skip

    def bare() -> None:
        seccomp = _memfd("seccomp", render_seccomp(spec))
        files = tuple(_memfd("file", c.encode()) for _, c in spec.files)
        argv = render_bwrap(spec, ["/bin/true"], BwrapFds(seccomp, files), bwrap=launcher.bwrap)
        subprocess.run(
            argv, pass_fds=(seccomp, *files), user=BARE_UID, group=BARE_UID, extra_groups=[],
            check=True,
        )  # fmt: skip
        for fd in (seccomp, *files):
            os.close(fd)

    def full() -> None:
        outcome = launcher.run(BUDGET, ["/bin/true"])
        if outcome.exit_code != 0:
            raise SystemExit(f"sandboxed true exited {outcome.exit_code}")

    for _ in range(10):
        bare()
        full()
    b, f = [], []
    for _ in range(runs):
        b.append(_ms(bare))
        f.append(_ms(full))
        # The launcher removes empty cgroup and workspace directories on its janitor
        # thread after returning; let that finish outside the timed region so it does
        # not overlap the next measurement (of either kind).
        janitor.drain()
    return statistics.median(b), statistics.median(f)


def warm(runs: int) -> tuple[float, float]:
    template = Path(tempfile.mkdtemp(prefix="bench-template-"))
    os.chmod(template, 0o755)
    (template / "README").write_text("template\n")
    b, w = [], []
    with WarmPool(template, BUDGET, capacity=2) as pool:
        pool.fill()

        def plain() -> None:
            subprocess.run(["/bin/true"], check=True)

        for i in range(runs + 10):
            base = _ms(plain)
            t = time.perf_counter()
            slot = pool.lease()
            outcome = slot.run(["/bin/true"], capture=False)
            elapsed = (time.perf_counter() - t) * 1000
            if outcome.exit_code != 0:
                raise SystemExit(f"pooled true exited {outcome.exit_code}")
            pool.release(slot)
            if i >= 10:
                b.append(base)
                w.append(elapsed)
    (template / "README").unlink()
    template.rmdir()
    return statistics.median(b), statistics.median(w)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    ok = True
    bare, full = cold(args.runs)
    ratio = full / bare
    ok &= ratio <= COLD_TARGET
    print(f"cold start-to-exit of true: launcher {full:.2f} ms, bare bwrap same flags "
          f"{bare:.2f} ms, ratio {ratio:.2f} (target <= {COLD_TARGET})")  # fmt: skip
    plain, pooled = warm(args.runs)
    ratio = pooled / plain
    ok &= ratio <= WARM_TARGET
    print(f"warm-pool lease-to-exit p50: {pooled:.2f} ms, plain fork/exec of /bin/true "
          f"{plain:.2f} ms, ratio {ratio:.2f} (target <= {WARM_TARGET})")  # fmt: skip
    print("all targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
