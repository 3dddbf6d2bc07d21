"""The cell's events: its incarnations and its workers' lifecycles.

They are defined with the worker's schedule in :mod:`charter.control.workers` (the
handler that appends them lives there); this module is where the runner names them.
A worker's lifecycle events go on its own stream (``worker:<lineage>``, after its
``WorkerScheduled``), so the start is pinned to the schedule being the stream's only
entry: a worker killed while queued can never start, and no worker starts twice.
The sandbox's own events (leased, started, exited, discarded) are the sandbox package's.
"""

from __future__ import annotations

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

__all__ = [
    "RESULT_CAP",
    "CellClaimRenewed",
    "CellStarted",
    "WorkerEnded",
    "WorkerKilled",
    "WorkerResult",
    "WorkerStarted",
    "WorkerWaiting",
    "RUNNER_EVENTS",
]

RUNNER_EVENTS = (
    CellStarted,
    CellClaimRenewed,
    WorkerStarted,
    WorkerWaiting,
    WorkerResult,
    WorkerKilled,
    WorkerEnded,
)
