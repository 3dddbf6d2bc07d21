"""The cell's view keeps a live-worker count per cell (what ``Cell.idle`` reads after
every step): it must always agree with a scan of the workers it folded."""

from __future__ import annotations

from charter.control import WorkerScheduled
from charter.core import Event
from charter.runner._view import WorkersView
from charter.runner.events import WorkerEnded

_DIGEST = "0" * 64


def _scheduled(lineage: str, cell: str) -> WorkerScheduled:
    return WorkerScheduled(
        fanout="f",
        lineage=lineage,
        cell=cell,
        argv=("/bin/true",),
        inputs_digest=_DIGEST,
        grant_digest=_DIGEST,
    )


def _scan(view: WorkersView, cell: str) -> int:
    return sum(w.live for w in view.on_cell(cell))


def test_the_live_count_agrees_with_a_scan_of_the_workers() -> None:
    view = WorkersView()
    history: list[Event] = [
        _scheduled("agent:a/w-1", "east"),
        _scheduled("agent:a/w-2", "east"),
        _scheduled("agent:a/w-3", "west"),
        WorkerEnded(lineage="agent:a/w-1", outcome="exited", exit_code=0),
        WorkerEnded(lineage="agent:a/w-1", outcome="exited", exit_code=0),  # twice: once
        _scheduled("agent:a/w-2", "west"),  # scheduled again, elsewhere: replaces it
        _scheduled("agent:a/w-1", "east"),  # an ended one scheduled again: live again
        WorkerEnded(lineage="agent:a/w-3", outcome="failed"),
    ]
    for position, event in enumerate(history, start=1):
        view.apply(event, position, 0)
        for cell in ("east", "west"):
            assert view.live_count.get(cell, 0) == _scan(view, cell), (position, cell)
    assert view.live_count == {"east": 1, "west": 1}
