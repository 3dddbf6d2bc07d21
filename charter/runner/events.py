"""The cell's events: its incarnations and its workers' lifecycles.

They are defined with the worker's schedule in :mod:`charter.control.workers` (the
handler that appends them lives there); this module is where the runner names them.
A worker's lifecycle events go on its own stream (``worker:<lineage>``, after its
``WorkerScheduled``), so the start is pinned to the schedule being the stream's only
entry: a worker killed while queued can never start, and no worker starts twice.
The sandbox's own events (leased, started, exited, discarded) are the sandbox package's.
The model door's calls (``ModelTokensHeld``, ``ModelCallSettled``, ``ModelTokensReleased``,
``ModelCallRefused``, and ``ModelCallReserved``, which older doors journaled per call:
docs/model-door.md) are defined here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from charter.budgets import HeldTokensCharged, HeldTokensReleased, TokensHeld
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
    "ModelTokensHeld",
    "ModelTokensReleased",
    "MODEL_NAME_CAP",
    "model_block_stream",
    "model_call_stream",
    "RUNNER_EVENTS",
]

MODEL_NAME_CAP = 256
"""The most characters of a requested model's name the journal keeps (the door refuses
longer names)."""


def model_call_stream(call: str) -> str:
    """The stream of one model call: its reservation, then its one settlement."""
    return f"modelcall:{call}"


def model_block_stream(block: str) -> str:
    """The stream of one block of a lease's tokens: the settlements of the calls drawn
    from it, then its release (its hold is on its lease's stream; one journaled before
    that was on this stream, first)."""
    return f"modelblock:{block}"


class ModelTokensHeld(TokensHeld):
    """A block of ``tokens`` of a lease is held for its model calls (docs/model-door.md):
    journaled before any call drawing from it is sent; its calls draw from it in memory
    and settle on its block's stream, and it is released (``ModelTokensReleased``) when
    no call will draw from it again. On its lease's stream (the lineage), pinned to the
    version its decision read, like a fan-out of the lease: a hold and a spawn decided
    on the same book conflict, and the later is decided again."""

    type_name = "ModelTokensHeld"
    block: str = Field(pattern=r"^[0-9a-f]{32}$")
    lineage: str
    cell: str
    tokens: int = Field(ge=1)

    def stream(self) -> str:
        return self.lineage

    def hold(self) -> tuple[str, str, int]:
        return self.block, self.lineage, self.tokens


class ModelTokensReleased(HeldTokensReleased):
    """The block's hold ends. ``recovered``: its cell died with it held, and the next
    incarnation charged what its settled calls had not (``charged``, an estimate: the
    ``UsageRecorded`` just before it), fail-closed; otherwise ``charged`` is what its
    calls' lost settlements were charged (0 when each settled)."""

    type_name = "ModelTokensReleased"
    block: str = Field(pattern=r"^[0-9a-f]{32}$")
    lineage: str
    charged: int = Field(ge=0)
    recovered: bool

    def stream(self) -> str:
        return model_block_stream(self.block)

    def released_hold(self) -> tuple[str, str]:
        return self.block, self.lineage


class ModelCallReserved(Event):
    """A worker's model call is about to be sent (journaled per call by the model door
    before blocks, ``ModelTokensHeld``; still read, audited and recovered):
    ``reserved`` tokens (the prompt's estimate plus ``max_tokens``) are held against its
    lease until the call settles. Journaled before the request leaves Charter."""

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


class ModelCallSettled(HeldTokensCharged):
    """The call is over and its tokens are charged (the ``UsageRecorded`` in the same
    append): from the server's reported usage (``estimated`` false), or, when no usage
    came (the stream was cut at the cap, the worker disconnected, the server failed,
    the cell restarted), an estimate (``estimated`` true, ``how`` says why).

    A call drawn from a block (``block``) is journaled only here, with its request's
    record (``model``, ``digest``, the estimate, ``max_tokens`` and what it drew,
    ``reserved``), on the block's stream; one reserved on its own
    (``ModelCallReserved``, ``block`` None) has those in its reservation."""

    type_name = "ModelCallSettled"
    call: str = Field(pattern=r"^[0-9a-f]{32}$")
    lineage: str
    block: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    model: str | None = Field(default=None, max_length=MODEL_NAME_CAP)
    digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    stream_response: bool | None = None
    prompt_estimate: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    reserved: int | None = Field(default=None, ge=1)
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    estimated: bool
    how: Literal["usage", "cut-at-cap", "client-gone", "upstream-failed", "no-usage", "recovered"]
    status: int = Field(ge=0)
    """The server's HTTP status (0: no answer)."""
    latency_ms: int = Field(ge=0)
    first_token_ms: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _drawn_with_its_record(self) -> ModelCallSettled:
        record = (self.model, self.digest, self.stream_response, self.prompt_estimate,
                  self.max_tokens, self.reserved)  # fmt: skip
        if (self.block is None) != all(f is None for f in record) or (
            self.block is not None and any(f is None for f in record)
        ):
            raise ValueError("a call drawn from a block carries its request's record; no other")
        return self

    def stream(self) -> str:
        if self.block is not None:
            return model_block_stream(self.block)
        return model_call_stream(self.call)

    def charged_from(self) -> tuple[str, str, int] | None:
        if self.block is None:
            return None
        return self.block, self.lineage, self.prompt_tokens + self.completion_tokens


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
    ModelTokensHeld,
    ModelTokensReleased,
)
