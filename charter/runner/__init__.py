"""charter.runner: the cell (follows the journal, runs the workers scheduled on it,
recovers after a crash) and the worker door."""

from charter.runner._logs import LOG_CAP, STREAMS, log_dir
from charter.runner.cell import Cell, kill_uid
from charter.runner.door import Door
from charter.runner.errors import (
    DemoFailedError,
    DoorRefusedError,
    NotAWorkerError,
    ResultTooLargeError,
    WaitRefusedError,
)
from charter.runner.events import (
    RESULT_CAP,
    RUNNER_EVENTS,
    CellStarted,
    WorkerEnded,
    WorkerKilled,
    WorkerResult,
    WorkerStarted,
    WorkerWaiting,
)
from charter.runner.host import DEFAULT_SLOT_BUDGET, cell_for, run_cell, steady_load

__all__ = [
    "LOG_CAP",
    "STREAMS",
    "log_dir",
    "Cell",
    "Door",
    "kill_uid",
    "cell_for",
    "run_cell",
    "steady_load",
    "DEFAULT_SLOT_BUDGET",
    "RESULT_CAP",
    "RUNNER_EVENTS",
    "CellStarted",
    "WorkerEnded",
    "WorkerKilled",
    "WorkerResult",
    "WorkerStarted",
    "WorkerWaiting",
    "DoorRefusedError",
    "DemoFailedError",
    "NotAWorkerError",
    "ResultTooLargeError",
    "WaitRefusedError",
]
