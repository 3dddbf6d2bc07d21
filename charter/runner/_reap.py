"""Which gone peers a cell reaps, and what of theirs moves: the follower's side of the
fabric's failure handling (docs/fabric.md). Pure over the cell's view; the cell
journals (``Cell._reap``), through the gone cell's own lifecycle and the spawn
service's placement."""

from __future__ import annotations

from charter.control import WorkerScheduled
from charter.runner._view import WorkersView

__all__ = ["gone_peers", "movable"]


def gone_peers(cell: str, view: WorkersView, at_ms: int, classes: frozenset[str]) -> list[str]:
    """The other cells gone by time at ``at_ms`` (their newest incarnation's claim
    lapsed, none renewed it) with work a peer must take: a started worker not ended (it
    is failed, its parent told) or one not started that may move (``movable``; one
    asking a class moves only while a live cell has it: ``classes``)."""
    return sorted(
        other
        for other in view.incarnations
        if other != cell
        and view.gone(other, at_ms)
        and view.live_count.get(other, 0) > 0
        and any(w.live and (w.sandbox_id is not None or _may_move(w.scheduled, w.killed, classes))
                for w in view.on_cell(other))
    )  # fmt: skip


def movable(
    gone: str, view: WorkersView, classes: frozenset[str]
) -> list[tuple[WorkerScheduled, int]]:
    """The workers of ``gone`` that move to a live cell, each with its stream's version:
    not started, not killed, not asked for that cell by their worker, and not asking a
    class no live cell has (``classes``: they wait on the gone cell's queue)."""
    return [
        (w.scheduled, w.version)
        for w in view.on_cell(gone)
        if w.live and w.sandbox_id is None and _may_move(w.scheduled, w.killed, classes)
    ]


def _may_move(scheduled: WorkerScheduled, killed: str | None, classes: frozenset[str]) -> bool:
    return (
        killed is None
        and not scheduled.requested
        and (scheduled.cell_class is None or scheduled.cell_class in classes)
    )
