"""Sampling a live sandbox's signals from the host, beside a quiet control: CPU, memory,
pids-limit hits and workspace writes each move when the worker does that thing, and not
before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import MemorySink, WarmPool, sample_signals, sandbox_pid, workspace_bytes
from tests.sandbox._supervised import FORK_TO_LIMIT, Running, wait_for

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=30s,cpu=30s,mem=128MiB,egress=0MB")

# Waits for /workspace/go, then burns CPU, holds 48 MiB, writes 4 MiB to the workspace
# and forks until pids.max refuses; says so in /workspace/ready; waits for /workspace/stop.
LOUD = (
    r"""
import os, time
while not os.path.exists("/workspace/go"):
    time.sleep(0.005)
n = 0
for _ in range(3_000_000):
    n += 1
hold = bytearray(48 * 1024 * 1024)
for i in range(0, len(hold), 4096):
    hold[i] = 1
with open("/workspace/out.bin", "wb") as f:
    f.write(os.urandom(4 * 1024 * 1024))
"""
    + FORK_TO_LIMIT
    + r"""for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
open("/workspace/ready", "w").close()
while not os.path.exists("/workspace/stop"):
    time.sleep(0.005)
"""
)


@pytest.fixture
def pool(scratch: Path, state_dir: Path) -> Iterator[WarmPool]:
    template = scratch / "template"
    template.mkdir(mode=0o755)
    with WarmPool(template, B, capacity=1, sink=MemorySink(), state_dir=state_dir, parked=0) as p:
        yield p


def test_each_signal_moves_when_the_worker_does_that_thing(pool: WarmPool) -> None:
    worker = Running(pool, LOUD)
    try:
        spec = worker.slot.spec
        wait_for(lambda: sandbox_pid(spec) is not None)
        quiet = sample_signals(spec)  # the control: before it does anything
        assert quiet.pids_limit_hits == 0
        assert quiet.workspace_bytes < 1024 * 1024
        assert quiet.memory_bytes < 40 * 1024 * 1024
        (worker.workspace / "go").write_text("")
        wait_for((worker.workspace / "ready").exists, timeout=30)
        loud = sample_signals(spec)
        assert loud.cpu_ms >= quiet.cpu_ms + 50
        assert loud.memory_peak_bytes >= 48 * 1024 * 1024
        assert loud.workspace_bytes >= 4 * 1024 * 1024
        assert loud.pids_limit_hits > 0
        assert loud.pids_current >= 2  # bwrap's two, at least
        pid = sandbox_pid(spec)
        assert pid is not None
        assert workspace_bytes(pid) == loud.workspace_bytes
        worker.stop()
        worker.join()
    finally:
        worker.release()
    gone = sample_signals(spec)  # a sandbox that is gone reads as zeros, never raises
    assert gone.pids_current == 0
