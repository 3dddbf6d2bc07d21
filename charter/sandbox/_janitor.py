"""Housekeeping off the critical path: removing the empty directories a finished sandbox
leaves (its cgroups, its scratch workspace). Only ever given things no process uses."""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
from collections.abc import Callable

__all__ = ["defer", "drain"]

_tasks: queue.Queue[Callable[[], None]] = queue.Queue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def _work() -> None:
    while True:
        task = _tasks.get()
        try:
            with contextlib.suppress(Exception):  # housekeeping: a stale cgroup is reaped later
                task()
        finally:
            _tasks.task_done()


def defer(task: Callable[[], None]) -> None:
    """Run ``task`` soon on the janitor thread."""
    global _thread  # noqa: PLW0603 (one janitor per process, started on first use)
    with _started:
        if _thread is None:
            _thread = threading.Thread(target=_work, daemon=True, name="sandbox-janitor")
            _thread.start()
    _tasks.put(task)


def drain() -> None:
    """Wait until every deferred task has run (tests, and at interpreter exit)."""
    if _thread is not None:
        _tasks.join()


atexit.register(drain)
