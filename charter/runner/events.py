"""The cell's events: its incarnations and its workers' lifecycles.

A worker's lifecycle events go on its own stream (``worker:<lineage>``, after its
``WorkerScheduled``), so the start is pinned to the schedule being the stream's only
entry: a worker killed while queued can never start, and no worker starts twice.
The sandbox's own events (leased, started, exited, discarded) are the sandbox package's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from charter.control import worker_stream
from charter.core.events import Event

__all__ = [
    "RESULT_CAP",
    "CellStarted",
    "WorkerEnded",
    "WorkerKilled",
    "WorkerResult",
    "WorkerStarted",
    "WorkerWaiting",
    "RUNNER_EVENTS",
]

RESULT_CAP = 64 * 1024
"""The most bytes of a worker's result the journal keeps (the door refuses more)."""


class CellStarted(Event):
    """A cell process began following the journal: ``incarnation`` counts its starts."""

    type_name = "CellStarted"
    cell: str
    incarnation: int = Field(ge=1)
    pid: int
    host: str

    def stream(self) -> str:
        return f"cellrun:{self.cell}"


class WorkerStarted(Event):
    """The cell took ``lineage`` into sandbox ``sandbox_id`` (committed before exec)."""

    type_name = "WorkerStarted"
    lineage: str
    cell: str
    incarnation: int = Field(ge=1)
    sandbox_id: str

    def stream(self) -> str:
        return worker_stream(self.lineage)


class WorkerWaiting(Event):
    """The worker waits on its children (its processing slot goes back, it holds a
    coordination slot); ``timeout_ms`` after which they are killed."""

    type_name = "WorkerWaiting"
    lineage: str
    children: tuple[str, ...]
    timeout_ms: int = Field(ge=0)

    def stream(self) -> str:
        return worker_stream(self.lineage)


class WorkerResult(Event):
    """The worker's reply, journaled with its digest (sha256 hex of the bytes)."""

    type_name = "WorkerResult"
    lineage: str
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0, le=RESULT_CAP)
    text: str = Field(max_length=RESULT_CAP)

    def stream(self) -> str:
        return worker_stream(self.lineage)


class WorkerKilled(Event):
    """``lineage`` is to be killed, journaled before the kill is sent."""

    type_name = "WorkerKilled"
    lineage: str
    reason: str

    def stream(self) -> str:
        return worker_stream(self.lineage)


class WorkerEnded(Event):
    """The worker is over: ``exited`` by itself, ``killed`` (after a WorkerKilled), or
    ``failed`` (its driver died: the cell restarted; never resumed)."""

    type_name = "WorkerEnded"
    lineage: str
    outcome: Literal["exited", "killed", "failed"]
    exit_code: int | None = None
    sandbox_id: str | None = None
    reason: str = ""

    def stream(self) -> str:
        return worker_stream(self.lineage)


RUNNER_EVENTS = (CellStarted, WorkerStarted, WorkerWaiting, WorkerResult, WorkerKilled, WorkerEnded)
