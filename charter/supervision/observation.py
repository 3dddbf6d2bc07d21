"""A live worker's signals, sampled: the one vocabulary of what supervision looks at.

Every signal is a non-negative integer, and every one but ``memory_bytes`` (a peak) and
``cpu_permille`` (the life-average CPU rate) is a counter that only grows over a
worker's life. So a worker's *profile* (the element-wise peak of its samples) is its
last sample for the counters, and an honest worker's sample never exceeds its own
profile: that is what lets a baseline learned from completed workers' profiles bound
the samples of a live one.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Observation", "Signal", "Signals", "observe"]


class Signal(StrEnum):
    """One sampled signal (the field of :class:`Signals` of the same name)."""

    CPU_MS = "cpu_ms"  # cgroup cpuacct.usage, in ms
    CPU_PERMILLE = "cpu_permille"  # cpu_ms per wall ms, in thousandths of a core
    CPU_THROTTLED_MS = "cpu_throttled_ms"  # CPU pressure: time held back by the quota
    MEMORY_BYTES = "memory_bytes"  # peak memory use (cgroup max_usage_in_bytes)
    MEMORY_FAILCNT = "memory_failcnt"  # memory pressure: times the limit was hit
    PIDS_LIMIT_HITS = "pids_limit_hits"  # forks refused by pids.max
    EGRESS_ATTEMPTS = "egress_attempts"  # connections asked of the egress broker
    EGRESS_REFUSALS = "egress_refusals"  # of those, refused
    SPAWN_CALLS = "spawn_calls"  # door spawns asked
    SPAWN_WIDTH = "spawn_width"  # the widest fan-out asked at the door
    SIGN_CALLS = "sign_calls"  # door sign calls
    RESULT_BYTES = "result_bytes"  # bytes of result handed to the door
    WORKSPACE_BYTES = "workspace_bytes"  # bytes written to the workspace (its upper layer)


_Count = Field(default=0, ge=0)


class Signals(BaseModel):
    """One value per :class:`Signal` (all non-negative integers)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu_ms: int = _Count
    cpu_permille: int = _Count
    cpu_throttled_ms: int = _Count
    memory_bytes: int = _Count
    memory_failcnt: int = _Count
    pids_limit_hits: int = _Count
    egress_attempts: int = _Count
    egress_refusals: int = _Count
    spawn_calls: int = _Count
    spawn_width: int = _Count
    sign_calls: int = _Count
    result_bytes: int = _Count
    workspace_bytes: int = _Count

    def value(self, signal: Signal) -> int:
        return int(getattr(self, signal.value))

    def peak(self, other: Signals) -> Signals:
        """The element-wise maximum: a profile absorbing one more sample."""
        return Signals(**{s.value: max(self.value(s), other.value(s)) for s in Signal})


class Observation(BaseModel):
    """A frozen sample of one live worker: who it is, when (``at_ms``, the sampler's
    clock; ``wall_ms``, the worker's age) and its :class:`Signals`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lineage: str = Field(min_length=1)
    sandbox_id: str = Field(min_length=1)
    task_class: str = Field(min_length=1, max_length=200)
    at_ms: int = Field(ge=0)
    wall_ms: int = Field(ge=0)
    signals: Signals


def observe(
    *,
    lineage: str,
    sandbox_id: str,
    task_class: str,
    at_ms: int,
    wall_ms: int,
    **counters: int,
) -> Observation:
    """An observation from raw counters (the :class:`Signals` fields but
    ``cpu_permille``, which is derived here: ``cpu_ms * 1000 // wall_ms``, 0 at age 0)."""
    cpu_ms = counters.get("cpu_ms", 0)
    permille = cpu_ms * 1000 // wall_ms if wall_ms > 0 else 0
    return Observation(
        lineage=lineage,
        sandbox_id=sandbox_id,
        task_class=task_class,
        at_ms=at_ms,
        wall_ms=wall_ms,
        signals=Signals(cpu_permille=permille, **counters),
    )
