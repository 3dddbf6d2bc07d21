"""The cell's events: its incarnations and its workers' lifecycles.

They are defined with the worker's schedule in :mod:`charter.control.workers` (the
handler that appends them lives there); this module is where the runner names them.
A worker's lifecycle events go on its own stream (``worker:<lineage>``, after its
``WorkerScheduled``), so the start is pinned to the schedule being the stream's only
entry: a worker killed while queued can never start, and no worker starts twice.
The sandbox's own events (leased, started, exited, discarded) are the sandbox package's.
The model door's calls (``ModelCallReserved``, ``ModelCallSettled``, ``ModelCallRefused``:
docs/model-door.md) are defined here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from charter.control.workers import (
    RESULT_CAP,
    CellClaimRenewed,
    CellStarted,
    WorkerEnded,
    WorkerKilled,
    WorkerResult,
    WorkerStarted,
    WorkerWaiting,
)
from charter.core.events import Event

__all__ = [
    "RESULT_CAP",
    "CellClaimRenewed",
    "CellStarted",
    "WorkerEnded",
    "WorkerKilled",
    "WorkerResult",
    "WorkerStarted",
    "WorkerWaiting",
    "ModelCallReserved",
    "ModelCallSettled",
    "ModelCallRefused",
    "MODEL_NAME_CAP",
    "model_call_stream",
    "RUNNER_EVENTS",
]

MODEL_NAME_CAP = 256
"""The most characters of a requested model's name the journal keeps (the door refuses
longer names)."""


def model_call_stream(call: str) -> str:
    """The stream of one model call: its reservation, then its one settlement."""
    return f"modelcall:{call}"


class ModelCallReserved(Event):
    """A worker's model call is about to be sent (docs/model-door.md): ``reserved``
    tokens (the prompt's estimate plus ``max_tokens``) are held against its lease until
    the call settles. Journaled before the request leaves Charter."""

    type_name = "ModelCallReserved"
    call: str = Field(pattern=r"^[0-9a-f]{32}$")
    lineage: str
    cell: str
    model: str = Field(max_length=MODEL_NAME_CAP)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    """sha256 of the request body as the worker sent it."""
    stream_response: bool
    prompt_estimate: int = Field(ge=0)
    max_tokens: int = Field(ge=1)
    reserved: int = Field(ge=1)

    def stream(self) -> str:
        return model_call_stream(self.call)


class ModelCallSettled(Event):
    """The call is over and its tokens are charged (the ``UsageRecorded`` in the same
    append): from the server's reported usage (``estimated`` false), or, when no usage
    came (the stream was cut at the cap, the worker disconnected, the server failed,
    the cell restarted), an estimate (``estimated`` true, ``how`` says why)."""

    type_name = "ModelCallSettled"
    call: str = Field(pattern=r"^[0-9a-f]{32}$")
    lineage: str
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    estimated: bool
    how: Literal["usage", "cut-at-cap", "client-gone", "upstream-failed", "no-usage", "recovered"]
    status: int = Field(ge=0)
    """The server's HTTP status (0: no answer)."""
    latency_ms: int = Field(ge=0)
    first_token_ms: int | None = Field(default=None, ge=0)

    def stream(self) -> str:
        return model_call_stream(self.call)


class ModelCallRefused(Event):
    """A model call not sent: its lease could not cover the reservation, or the model
    door is not configured (journaled once per lease and reason: later refusals are
    answered only)."""

    type_name = "ModelCallRefused"
    lineage: str
    reason: str
    message: str
    needed: int = Field(ge=0)
    left: int


RUNNER_EVENTS = (
    CellStarted,
    CellClaimRenewed,
    WorkerStarted,
    WorkerWaiting,
    WorkerResult,
    WorkerKilled,
    WorkerEnded,
    ModelCallReserved,
    ModelCallSettled,
    ModelCallRefused,
)
