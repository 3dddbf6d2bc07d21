"""Sample a live sandbox's signals from the host: its cgroup's CPU, memory and pids
counters, what it has written to its workspace, and its egress broker's tallies.

A sample is a handful of small kernel-file reads (no process of the sandbox is touched,
none is woken), cheap enough to take every few hundred milliseconds per worker.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from charter.sandbox._cgroup import cgroup_dirs, controller_dir, read_int, read_text
from charter.sandbox.egress import EgressBroker
from charter.sandbox.spec import CgroupMode, SandboxSpec

__all__ = ["SandboxSignals", "sample_signals", "sandbox_pid", "workspace_bytes"]


class SandboxSignals(BaseModel):
    """One sample of a live sandbox, as the host sees it (cumulative counters since the
    sandbox's cgroup was made, but ``memory_bytes`` and ``pids_current``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu_ms: int
    cpu_throttled_ms: int  # CPU pressure: time its quota held it back
    cpu_throttled_periods: int
    memory_bytes: int  # in use now
    memory_peak_bytes: int
    memory_failcnt: int  # memory pressure: times the limit was hit
    oom_kills: int
    pids_current: int
    pids_limit_hits: int
    workspace_bytes: int  # bytes its workspace's writable layer holds
    egress_attempts: int
    egress_refusals: int


def sandbox_pid(spec: SandboxSpec) -> int | None:
    """A process inside the sandbox's own mount namespace (one that sees its
    ``/workspace``), or None when it has none left. ``/proc/<pid>/root`` of it is the
    sandbox's root as the sandbox sees it, reachable by the host's root."""
    procs = controller_dir(
        spec.cgroup_mode, cgroup_dirs(spec.cgroup_mode, spec.cgroup_name), "pids"
    )
    try:
        members = [int(x) for x in read_text(procs / "cgroup.procs").split()]
    except OSError:
        return None
    for pid in members:
        with contextlib.suppress(OSError):
            if os.path.isdir(f"/proc/{pid}/root/workspace"):
                return pid
    return None


def workspace_bytes(pid: int) -> int:
    """What the workspace of the sandbox holding ``pid`` has written: the used bytes of
    its writable layer (a tmpfs, or an overlay, whose statfs is its upper layer's)."""
    try:
        st = os.statvfs(f"/proc/{pid}/root/workspace")
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _keyed(path: Path) -> dict[str, int]:
    """A flat keyed kernel file (``name value`` lines) in one read; empty when it cannot
    be read (the sandbox is gone)."""
    try:
        text = read_text(path)
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[name] = int(value)
    return out


def sample_signals(spec: SandboxSpec, egress: EgressBroker | None = None) -> SandboxSignals:
    """The sandbox's signals now (a counter that cannot be read, because the sandbox is
    gone, reads 0)."""
    dirs = cgroup_dirs(spec.cgroup_mode, spec.cgroup_name)

    def at(controller: str) -> Path:
        return controller_dir(spec.cgroup_mode, dirs, controller)

    attempts = egress.attempts(spec.host_uid) if egress is not None else []
    pid = sandbox_pid(spec)
    ws = workspace_bytes(pid) if pid is not None else 0
    egress_attempts = sum(a.count for a in attempts)
    egress_refusals = sum(a.count for a in attempts if not a.allowed)
    match spec.cgroup_mode:
        case CgroupMode.V1:
            cpu = _keyed(at("cpu") / "cpu.stat")  # one read for both of its keys
            return SandboxSignals(
                cpu_ms=read_int(at("cpuacct") / "cpuacct.usage") // 1_000_000,
                cpu_throttled_ms=cpu.get("throttled_time", 0) // 1_000_000,
                cpu_throttled_periods=cpu.get("nr_throttled", 0),
                memory_bytes=read_int(at("memory") / "memory.usage_in_bytes"),
                memory_peak_bytes=read_int(at("memory") / "memory.max_usage_in_bytes"),
                memory_failcnt=read_int(at("memory") / "memory.failcnt"),
                oom_kills=read_int(at("memory") / "memory.oom_control", "oom_kill"),
                pids_current=read_int(at("pids") / "pids.current"),
                pids_limit_hits=read_int(at("pids") / "pids.events", "max"),
                workspace_bytes=ws,
                egress_attempts=egress_attempts,
                egress_refusals=egress_refusals,
            )
        case CgroupMode.V2:
            d = Path(dirs[0])
            cpu = _keyed(d / "cpu.stat")
            return SandboxSignals(
                cpu_ms=cpu.get("usage_usec", 0) // 1000,
                cpu_throttled_ms=cpu.get("throttled_usec", 0) // 1000,
                cpu_throttled_periods=cpu.get("nr_throttled", 0),
                memory_bytes=read_int(d / "memory.current"),
                memory_peak_bytes=read_int(d / "memory.peak"),
                memory_failcnt=read_int(d / "memory.events", "max"),
                oom_kills=read_int(d / "memory.events", "oom_kill"),
                pids_current=read_int(d / "pids.current"),
                pids_limit_hits=read_int(d / "pids.events", "max"),
                workspace_bytes=ws,
                egress_attempts=egress_attempts,
                egress_refusals=egress_refusals,
            )
