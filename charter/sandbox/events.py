"""The sandbox lifecycle events (part of the ledger's event catalogue). The lease is
journaled before the start, always."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from charter.core.events import Event

__all__ = [
    "EgressAttempted",
    "SandboxDiscarded",
    "SandboxExited",
    "SandboxLeased",
    "SandboxProbeRefused",
    "SandboxQuarantined",
    "SandboxStarted",
    "SandboxUsage",
]


class SandboxUsage(BaseModel):
    """What a sandbox consumed, read from its cgroup and the clock."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_ms: int
    cpu_ms: int
    memory_peak_bytes: int
    oom_kills: int
    pids_limit_hits: int
    egress_bytes: int = 0


class _SandboxEvent(Event):
    sandbox_id: str

    def stream(self) -> str | None:
        return f"sandbox:{self.sandbox_id}"


class SandboxLeased(_SandboxEvent):
    """A sandbox (cold or a warm-pool slot) is leased to run one command."""

    type_name = "SandboxLeased"
    host_uid: int
    pool: str | None
    budget: dict[str, int]
    pids_max: int
    memory_bytes: int
    cpu_quota_us: int
    cpu_period_us: int
    wall_ms: int
    egress: tuple[str, ...]


class SandboxStarted(_SandboxEvent):
    type_name = "SandboxStarted"
    pid: int
    command: tuple[str, ...]


class SandboxExited(_SandboxEvent):
    """The command ended: ``how`` says whether by itself, by a signal or by the wall clock."""

    type_name = "SandboxExited"
    exit_code: int
    how: Literal["exited", "signalled", "wall_clock"]
    usage: SandboxUsage


class SandboxDiscarded(_SandboxEvent):
    """The sandbox and its overlay are destroyed; the slot is never reused."""

    type_name = "SandboxDiscarded"


class SandboxQuarantined(_SandboxEvent):
    """An anomalous sandbox was destroyed and its slot withheld for good."""

    type_name = "SandboxQuarantined"
    reason: str


class SandboxProbeRefused(Event):
    """The host failed the isolation probe; spawning is refused."""

    type_name = "SandboxProbeRefused"
    failed: tuple[str, ...]
    detail: str


class EgressAttempted(_SandboxEvent):
    """One attempt to leave a sandbox through the egress broker, allowed or denied."""

    type_name = "EgressAttempted"
    host_uid: int
    destination: str
    allowed: bool
    reason: str
    bytes_out: int = 0
    bytes_in: int = 0
