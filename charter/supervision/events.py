"""Supervision's events: its verdicts, each with its evidence, the canaries planted in a
sandbox, the profiles of ended workers, and the baselines learned from them.

A verdict is a fact committed before anyone acts on it: the cell carries out the
committed entry, whoever appended it (the supervision loop, an operator, a replay).
Verdicts of one worker go on ``supervise:<lineage>``, so two deciders racing on one
worker conflict on the stream instead of both acting; a task class's profiles and
baselines go on ``baseline:<task class>``, so its versions are one sequence.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from charter.core.events import Event
from charter.supervision.observation import Observation, Signal, Signals

__all__ = [
    "Action",
    "BandStats",
    "BaselineChanged",
    "CanariesPlanted",
    "Evidence",
    "KillVerdict",
    "PauseVerdict",
    "QuarantineVerdict",
    "ResumeVerdict",
    "SUPERVISION_EVENTS",
    "ThrottleVerdict",
    "Verdict",
    "WorkerProfiled",
    "WorkspaceDigested",
    "baseline_stream",
    "supervise_stream",
]

Action = Literal["throttle", "pause", "kill", "quarantine"]
"""What a rule asks for when its signal is out of band (``resume`` is never asked by a
rule: it follows when every signal is back within band)."""


def supervise_stream(lineage: str) -> str:
    return f"supervise:{lineage}"


def baseline_stream(task_class: str) -> str:
    return f"baseline:{task_class}"


class Evidence(BaseModel):
    """Why: the signal, the value observed, the band's upper bound it was held against,
    the threshold the rule derives from that bound (``observed > threshold`` triggers),
    and the versions of the baseline and policy that decided. A canary touch names the
    canary instead of a band (``baseline_version`` None, ``threshold`` 0)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    signal: Signal | Literal["canary", "operator"]
    observed: int = Field(ge=0)
    upper: int = Field(ge=0)
    threshold: int = Field(ge=0)
    baseline_version: int | None = Field(default=None, ge=1)
    policy_version: int = Field(ge=1)
    canary: str | None = None
    operator: str | None = None  # an operator's verdict (signal "operator"): who
    reason: str | None = None  # ...and why, in their words


class _Verdict(Event):
    """A verdict on one worker, with the observation it was decided on."""

    lineage: str = Field(min_length=1)
    sandbox_id: str = Field(min_length=1)
    task_class: str = Field(min_length=1)
    evidence: tuple[Evidence, ...] = Field(min_length=1)
    observation: Observation | None = None

    def stream(self) -> str:
        return supervise_stream(self.lineage)


class ThrottleVerdict(_Verdict):
    """Lower the sandbox's CPU quota to ``quota_permille`` of a core (reversible)."""

    type_name = "ThrottleVerdict"
    quota_permille: int = Field(ge=1)


class PauseVerdict(_Verdict):
    """Freeze the sandbox (cgroup freezer; reversible). Its wall clock and its lease's
    expiry keep running while it is frozen."""

    type_name = "PauseVerdict"


class ResumeVerdict(_Verdict):
    """Thaw a paused sandbox and restore a throttled one's CPU quota: every signal is
    back within its band (the evidence shows each one against its bound)."""

    type_name = "ResumeVerdict"


class KillVerdict(_Verdict):
    """Kill the sandbox (freeze, then SIGKILL); its usage is charged as for any kill."""

    type_name = "KillVerdict"


class QuarantineVerdict(_Verdict):
    """Kill the sandbox, keep its workspace as evidence (its digest journaled by the
    cell), withhold its slot and revoke its subtree. A canary touch always gives one."""

    type_name = "QuarantineVerdict"


class WorkspaceDigested(Event):
    """The cell froze quarantined ``sandbox_id`` and digested its workspace (sha256 hex
    over every entry, :func:`charter.sandbox.digest_workspace`) before killing it: the
    evidence of what the worker left. ``error`` says why no digest could be made (the
    sandbox had no process left to read it through); the kill goes on either way."""

    type_name = "WorkspaceDigested"
    lineage: str = Field(min_length=1)
    sandbox_id: str = Field(min_length=1)
    digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    files: int = Field(default=0, ge=0)
    bytes: int = Field(default=0, ge=0)
    truncated: bool = False
    error: str | None = None

    def stream(self) -> str:
        return supervise_stream(self.lineage)


Verdict = ThrottleVerdict | PauseVerdict | ResumeVerdict | KillVerdict | QuarantineVerdict


class CanariesPlanted(Event):
    """Sandbox ``sandbox_id`` holds these canaries (see
    :mod:`charter.supervision.honeytokens`): ``credential_file`` (a path under its
    workspace), ``secret_name`` (a decoy secret behind the door) and
    ``egress_destination`` (a decoy destination for the broker)."""

    type_name = "CanariesPlanted"
    sandbox_id: str = Field(min_length=1)
    lineage: str | None = None
    credential_file: str
    secret_name: str
    egress_destination: str

    def stream(self) -> str:
        return f"canaries:{self.sandbox_id}"


class WorkerProfiled(Event):
    """A worker of ``task_class`` ended ``outcome``; ``profile`` is the peak of each of
    its signals over its sampled life. Only ``completed`` profiles are learned."""

    type_name = "WorkerProfiled"
    lineage: str = Field(min_length=1)
    task_class: str = Field(min_length=1)
    outcome: str = Field(min_length=1)
    profile: Signals

    def stream(self) -> str:
        return baseline_stream(self.task_class)


class BandStats(BaseModel):
    """One signal's integer statistics over ``n`` completed profiles, and the band they
    give: ``[0, upper]``, with ``upper = max(peak, total // n + SIGMAS * sd)`` where
    ``sd = isqrt(n * total_sq - total**2) // n`` (all integer arithmetic, so a replay
    gives the same bands to the bit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    signal: Signal
    n: int = Field(ge=0)
    total: int = Field(ge=0)
    total_sq: int = Field(ge=0)
    peak: int = Field(ge=0)
    upper: int = Field(ge=0)


class BaselineChanged(Event):
    """Task class ``task_class``'s baseline is now at ``version``, learned from
    ``completed`` profiles (the last from ``lineage``); ``bands`` hold every signal's
    statistics, so this entry alone rebuilds the baseline."""

    type_name = "BaselineChanged"
    task_class: str = Field(min_length=1)
    version: int = Field(ge=1)
    completed: int = Field(ge=1)
    lineage: str = Field(min_length=1)
    bands: tuple[BandStats, ...]

    def stream(self) -> str:
        return baseline_stream(self.task_class)


SUPERVISION_EVENTS: tuple[type[Event], ...] = (
    ThrottleVerdict,
    PauseVerdict,
    ResumeVerdict,
    KillVerdict,
    QuarantineVerdict,
    CanariesPlanted,
    WorkerProfiled,
    BaselineChanged,
    WorkspaceDigested,
)
