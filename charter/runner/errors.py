"""Errors of the runner (the cell and its door), over the fault groups in
:mod:`charter.core.errors`. Each refusal has its own stable ``reason`` code."""

from __future__ import annotations

from typing import ClassVar

from charter.control.errors import CellSupersededError
from charter.core.errors import BadInputError, RefusedError, StateError

__all__ = [
    "DoorRefusedError",
    "LeaseSpentError",
    "NotAWorkerError",
    "ResultTooLargeError",
    "ResultGivenError",
    "JournalAllowanceError",
    "ControlPlaneCpuError",
    "WorkerGoneError",
    "RevokeRefusedError",
    "WaitRefusedError",
    "ModelTokensError",
    "ModelNotConfiguredError",
    "ModelRequestError",
    "ModelCallSettledError",
    "CellClaimHeldError",
    "CellSupersededError",
    "WorkerRunningError",
    "DemoFailedError",
]


class DoorRefusedError(RefusedError, abstract=True):
    """A worker's request through its door, refused by policy (exit 4)."""

    reason: ClassVar[str] = "door"


class NotAWorkerError(DoorRefusedError):
    """The peer is not a live worker of this cell (or holds no key here)."""

    reason = "not-a-worker"


class WaitRefusedError(DoorRefusedError):
    """A worker asked to wait on a lineage that is not one of its children."""

    reason = "not-a-child"


class RevokeRefusedError(DoorRefusedError):
    """A worker asked to revoke a lineage that is not one of its own descendants (a
    worker may revoke only below itself: never itself, a sibling or an ancestor)."""

    reason = "not-a-descendant"


class ResultTooLargeError(DoorRefusedError):
    """A worker's result is over the size the journal keeps."""

    reason = "result-too-large"


class ResultGivenError(DoorRefusedError):
    """A worker's result (its one answer) was journaled already: a worker writes at
    most one result to the journal, so its journal bytes are bounded."""

    reason = "result-given"


class JournalAllowanceError(DoorRefusedError):
    """A journal write a worker caused (a result, a wait, a spawn) is more than its
    lease's journal allowance can pay for: the floor is spent and the lease's egress
    does not hold the rest (docs/door.md). The first refusal of each lease is
    journaled."""

    reason = "journal-allowance"


class ControlPlaneCpuError(DoorRefusedError):
    """The door has spent more CPU serving a worker than the worker's own CPU allows
    (a multiple of it, plus a base; docs/door.md): the request is refused, unserved,
    and the connection closed, until the worker has used more of its own."""

    reason = "control-plane-cpu"


class WorkerGoneError(DoorRefusedError):
    """The worker a connection was serving is no longer in its sandbox (it ended, was
    killed, or its uid now holds another sandbox), or the door closed, while one of
    its requests was being served: the request is abandoned, its thread ends."""

    reason = "worker-gone"


class ModelTokensError(DoorRefusedError):
    """A model call's reservation (its prompt's estimate plus ``max_tokens``) is more
    than the worker's lease has left of its tokens, net of its calls in flight: it is
    not sent (docs/model-door.md). HTTP 429 to the worker."""

    reason = "model-tokens"


class ModelNotConfiguredError(DoorRefusedError):
    """The operator has configured no model endpoint (``charter model configure``):
    nothing is sent. HTTP 503 to the worker."""

    reason = "model-not-configured"


class ModelRequestError(BadInputError):
    """A model call that is not a chat completion the door can meter: not JSON, no
    ``messages``, a ``max_tokens`` that is not a positive integer, an oversized body.
    HTTP 400 to the worker; nothing is sent or journaled."""


class ModelCallSettledError(StateError):
    """A model call's settlement found the call settled already (a later incarnation of
    the cell recovered it at its reservation): nothing more is charged for it."""


class LeaseSpentError(RefusedError):
    """A worker's lease or grant has expired, or holds no time to run, when its sandbox
    would start: it is not started (it ends failed)."""

    reason = "lease-spent"


class WorkerRunningError(RefusedError):
    """An operator asked to release the lease of a worker that is running: its usage
    would then be refused and charged nowhere. Revoke it instead (``charter revoke``):
    the cell kills it, charges what it used, then returns its lease."""

    reason = "worker-running"


class CellClaimHeldError(StateError):
    """Another incarnation of the cell holds its claim (it renews it while it runs): a
    new ``cell run`` waits for it to lapse, and says so when it stops waiting (take the
    cell over at once with ``--take-over``)."""


class DemoFailedError(StateError):
    """The demo's coordinator ended without its report (its reason is in the message)."""
