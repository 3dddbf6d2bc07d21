"""Pause (the cgroup freezer) and throttle (the CPU quota) on real sandboxes: a frozen
worker makes no progress and resumes after the thaw, a frozen one still dies at its wall
clock and when killed, and a throttled worker's CPU rate drops and comes back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import (
    MemorySink,
    SandboxControl,
    SandboxUnavailableError,
    WarmPool,
    sample_signals,
)
from charter.sandbox._cgroup import missing_hierarchies
from tests.sandbox._supervised import BUSY, COUNTER, Running, wait_for

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=30s,cpu=30s,mem=64MiB,egress=0MB")


@pytest.fixture
def pool(scratch: Path, state_dir: Path, sink: MemorySink) -> Iterator[WarmPool]:
    template = scratch / "template"
    template.mkdir(mode=0o755)
    with WarmPool(template, B, capacity=2, sink=sink, state_dir=state_dir, parked=0) as p:
        yield p


def test_a_frozen_worker_makes_no_progress_and_resumes_after_the_thaw(pool: WarmPool) -> None:
    worker = Running(pool, COUNTER)
    try:
        control = SandboxControl(worker.slot.spec)
        wait_for(lambda: worker.counter() > 1000)
        took = control.freeze()
        assert control.frozen()
        assert took < 1.0
        frozen_at = worker.counter()
        cpu_at = sample_signals(worker.slot.spec).cpu_ms
        # Positive control first: while running, the same window shows progress.
        time.sleep(0.5)  # an observation window, not a wait for a condition
        assert worker.counter() == frozen_at, "a frozen worker counted on"
        assert sample_signals(worker.slot.spec).cpu_ms == cpu_at
        control.thaw()
        assert not control.frozen()
        wait_for(lambda: worker.counter() > frozen_at + 1000, timeout=5)
        worker.stop()
        outcome = worker.join()
        assert (outcome.how, outcome.exit_code) == ("exited", 0)
    finally:
        worker.release()


def test_a_running_worker_counts_in_the_same_window(pool: WarmPool) -> None:
    """The control of the test above: the window is long enough to see progress."""
    worker = Running(pool, COUNTER)
    try:
        wait_for(lambda: worker.counter() > 1000)
        before = worker.counter()
        time.sleep(0.5)
        assert worker.counter() > before
        worker.stop()
        worker.join()
    finally:
        worker.release()


def test_a_paused_workers_wall_clock_keeps_running(scratch: Path, state_dir: Path) -> None:
    """Frozen from its first moments, a worker with a 3 s wall clock still ends at 3 s
    (exit 124): the deadline is the host's clock, not the sandbox's CPU time; and the
    kill of a frozen sandbox works (its tasks are thawed after the SIGKILLs)."""
    short = Budget.parse("tokens=0,wall=3s,cpu=3s,mem=64MiB,egress=0MB")
    template = scratch / "t2"
    template.mkdir(mode=0o755)
    with WarmPool(template, short, capacity=1, sink=MemorySink(), state_dir=state_dir) as p:
        worker = Running(p, COUNTER)
        try:
            SandboxControl(worker.slot.spec).freeze()
            outcome = worker.join(timeout=15)
            elapsed = time.monotonic() - worker.started
            assert (outcome.how, outcome.exit_code) == ("wall_clock", 124)
            assert 2.9 <= elapsed < 6.0
            assert worker.slot.proc is not None
            assert worker.slot.proc.cgroup.pids() == []
        finally:
            worker.release()


def test_a_frozen_sandbox_is_killed_at_once(pool: WarmPool) -> None:
    worker = Running(pool, COUNTER)
    try:
        wait_for(lambda: worker.counter() > 0)
        SandboxControl(worker.slot.spec).freeze()
        assert worker.slot.proc is not None
        start = time.monotonic()
        assert worker.slot.proc.cgroup.kill_all(timeout=2.0)
        assert time.monotonic() - start < 1.0
        outcome = worker.join()
        assert outcome.how == "signalled"
    finally:
        worker.release()


def _cpu_rate(worker: Running, seconds: float = 1.5) -> float:
    """CPU thousandths of a core over a window."""
    spec = worker.slot.spec
    cpu0, t0 = sample_signals(spec).cpu_ms, time.monotonic()
    time.sleep(seconds)  # the window the rate is measured over
    cpu1, t1 = sample_signals(spec).cpu_ms, time.monotonic()
    return (cpu1 - cpu0) / (t1 - t0)


def test_a_throttled_workers_cpu_rate_drops_and_comes_back(pool: WarmPool) -> None:
    """The quota is set to a quarter of what the worker gets now (the machine is shared,
    so what it gets unthrottled varies): its rate then stays at the quota, and the
    kernel counts the periods it held the worker back."""
    worker = Running(pool, BUSY)
    try:
        spec = worker.slot.spec
        control = SandboxControl(spec)
        assert control.cpu_quota_us() == spec.cpu_quota_us
        wait_for(lambda: sample_signals(spec).cpu_ms > 100)
        free = _cpu_rate(worker)
        permille = max(20, int(free) // 4)
        quota = control.throttle(permille)
        assert quota == spec.cpu_period_us * permille // 1000
        assert control.cpu_quota_us() == quota
        periods = sample_signals(spec).cpu_throttled_periods
        held = _cpu_rate(worker)
        assert sample_signals(spec).cpu_throttled_periods > periods  # the quota bit
        control.restore()
        assert control.cpu_quota_us() == spec.cpu_quota_us
        back = _cpu_rate(worker)
        assert held <= permille * 1.2 + 10, (held, permille)
        assert free >= 2 * held, (free, held)
        assert back >= 2 * held, (back, held)
        worker.stop()
        worker.join()
    finally:
        worker.release()


def test_throttling_never_raises_the_quota(pool: WarmPool) -> None:
    worker = Running(pool, BUSY)
    try:
        control = SandboxControl(worker.slot.spec)
        assert control.throttle(10**6) == worker.slot.spec.cpu_quota_us
        assert control.throttle(0) == 1000  # the kernel's floor
        worker.stop()
        worker.join()
    finally:
        worker.release()


def test_a_gone_sandbox_cannot_be_frozen(pool: WarmPool) -> None:
    worker = Running(pool, COUNTER)
    spec = worker.slot.spec
    worker.stop()
    worker.join()
    worker.release()
    wait_for(lambda: not any(Path(d).exists() for d in SandboxControl(spec).dirs))
    with pytest.raises(SandboxUnavailableError):
        SandboxControl(spec).freeze()
    with pytest.raises(SandboxUnavailableError):
        SandboxControl(spec).throttle(100)


def test_the_hierarchies_a_sandbox_needs_are_named_when_missing() -> None:
    """What the refusal names on a host without the freezer (the check reads the mount
    table; this host's own has every hierarchy, the control)."""
    here = Path("/proc/self/mounts").read_text()
    assert missing_hierarchies(here) == []
    without = "\n".join(line for line in here.splitlines() if "freezer" not in line)
    assert missing_hierarchies(without) == ["freezer"]
    joint = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n"
    assert missing_hierarchies(joint) == ["pids", "memory", "freezer"]
