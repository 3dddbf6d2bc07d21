"""What a cell is doing, read from the journal: each worker's status and budget burn,
the cell's caps, slot holders and queue (``charter cell status``, the demo's tree)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from charter.budgets import ResourceClass
from charter.control import ResourceView, WorkerStatus
from charter.core import now_ms
from charter.ledger import Journal
from charter.runner._view import WorkersView
from charter.runner.events import CellStarted

__all__ = ["CellStatus", "Row", "cell_status", "latest_incarnation", "running_below", "tree_rows"]


@dataclass(frozen=True)
class Row:
    """One worker, with its status in the one vocabulary the projections share
    (:data:`charter.control.WorkerStatus`): ``queued``, ``admitted``, ``running``,
    ``waiting``, or how it ended."""

    lineage: str
    depth: int
    status: WorkerStatus
    burn: str

    def to_json(self) -> dict[str, Any]:
        return {"lineage": self.lineage, "status": self.status, "burn": self.burn}


@dataclass(frozen=True)
class CellStatus:
    """The cell as read at ``read_at_ms``: ``state`` is ``never-run``, ``live`` (its
    newest incarnation's claim holds, or has no bound) or ``gone`` (the claim lapsed
    unrenewed: derived by time, whoever reads; its started workers read ``lost``)."""

    cell: str
    position: int
    caps: dict[str, int]
    holders: dict[str, list[str]]
    queued: list[str]
    workers: tuple[Row, ...]
    incarnation: int = 0
    state: str = "never-run"
    claim_until_ms: int | None = None
    read_at_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "position": self.position,
            "incarnation": self.incarnation,
            "state": self.state,
            "claim_until_ms": self.claim_until_ms,
            "read_at_ms": self.read_at_ms,
            "caps": self.caps,
            "holders": self.holders,
            "queued": self.queued,
            "workers": [w.to_json() for w in self.workers],
        }


def tree_rows(
    view: WorkersView, resources: ResourceView, cell: str, at_ms: int | None = None
) -> list[Row]:
    """Each worker's status and budget burn (what it was charged of what it holds), as
    read at ``at_ms`` (default: now)."""
    now = now_ms() if at_ms is None else at_ms
    gone = view.gone(cell, now)
    state = resources.cells.cells().get(cell)
    queued = state.queued[ResourceClass.PROCESSING] if state is not None else {}
    coordinating = state.holders[ResourceClass.COORDINATION] if state is not None else set()
    rows = []
    for lineage in sorted(view.workers):
        w = view.workers[lineage]
        status: WorkerStatus
        if w.ended is not None:
            status = w.ended.outcome
        elif w.sandbox_id is not None and gone:
            status = "lost"  # its cell is gone by time: the next incarnation fails it
        elif w.sandbox_id is not None:
            # Waiting on its children: from its swap to a coordination slot until it
            # holds a processing slot again (queued for one meanwhile, it still waits).
            waits = w.waiting and (lineage in coordinating or lineage in queued)
            status = "waiting" if waits else "running"
        elif lineage in queued:
            status = "queued"
        else:
            status = "admitted"
        burn = ""
        if lineage in resources.book:
            ledger = resources.book.get(lineage)
            own, whole = ledger.spent, ledger.allocation
            burn = (
                f"cpu {own.cpu_ms / 1000:.2f}s of {whole.cpu_ms // 1000}s, "
                f"wall {own.wall_ms / 1000:.1f}s of {whole.wall_ms // 1000}s"
            )
            if ledger.active(now) and ledger.children:
                held = whole.cpu_ms - resources.book.remaining(lineage, now).cpu_ms
                burn += f" (cpu {held // 1000}s out to children)"
        rows.append(Row(lineage, lineage.count("/"), status, burn))
    return rows


def cell_status(journal: Journal, cell: str) -> CellStatus:
    """The cell as the journal stands now."""
    view, resources = WorkersView(), ResourceView()
    view.refresh(journal)
    resources.refresh(journal)
    state = resources.cells.get(cell)
    at = now_ms()
    incarnation, until = view.claim(cell)
    liveness = "never-run" if not incarnation else "gone" if view.gone(cell, at) else "live"
    rows = tree_rows(view, resources, cell, at)
    return CellStatus(
        cell=cell,
        position=max(view.position, resources.position),
        caps={str(k): v for k, v in state.caps.items()},
        holders={str(k): sorted(v) for k, v in state.holders.items() if v},
        queued=list(state.queued[ResourceClass.PROCESSING]),
        workers=tuple(r for r in rows if r.status != "exited"),
        incarnation=incarnation,
        state=liveness,
        claim_until_ms=until,
        read_at_ms=at,
    )


def latest_incarnation(journal: Journal, cell: str) -> CellStarted | None:
    """The last ``CellStarted`` of ``cell`` (its running or last incarnation)."""
    found: CellStarted | None = None
    for entry in journal.entries(types=(CellStarted.type_name,)):
        if isinstance(entry.event, CellStarted) and entry.event.cell == cell:
            found = entry.event
    return found


def running_below(journal: Journal, lineage: str) -> list[str]:
    """The workers at or below ``lineage`` that started and have not ended."""
    view = WorkersView()
    view.refresh(journal)
    prefix = lineage + "/"
    return sorted(
        w.lineage
        for w in view.workers.values()
        if w.live
        and w.sandbox_id is not None
        and (w.lineage == lineage or w.lineage.startswith(prefix))
    )
