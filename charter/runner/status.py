"""What a cell is doing, read from the journal: each worker's status and budget burn,
the cell's caps, slot holders and queue (``charter cell status``, the demo's tree)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from charter.budgets import ResourceClass
from charter.control import ResourceView
from charter.core import now_ms
from charter.ledger import Journal
from charter.runner._view import WorkersView
from charter.runner.events import CellStarted

__all__ = ["CellStatus", "Row", "cell_status", "latest_incarnation", "running_below", "tree_rows"]


@dataclass(frozen=True)
class Row:
    """One worker: ``queued`` (waiting for a processing slot), ``admitted`` (holds one,
    not started yet), ``running``, ``waiting`` (on its children, holding a coordination
    slot), or how it ended: ``exited``, ``failed``, ``killed``."""

    lineage: str
    depth: int
    status: str
    burn: str

    def to_json(self) -> dict[str, Any]:
        return {"lineage": self.lineage, "status": self.status, "burn": self.burn}


@dataclass(frozen=True)
class CellStatus:
    cell: str
    position: int
    caps: dict[str, int]
    holders: dict[str, list[str]]
    queued: list[str]
    workers: tuple[Row, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "position": self.position,
            "caps": self.caps,
            "holders": self.holders,
            "queued": self.queued,
            "workers": [w.to_json() for w in self.workers],
        }


def tree_rows(view: WorkersView, resources: ResourceView, cell: str) -> list[Row]:
    """Each worker's status and budget burn (what it was charged of what it holds)."""
    now = now_ms()
    state = resources.cells.cells().get(cell)
    queued = state.queued[ResourceClass.PROCESSING] if state is not None else {}
    rows = []
    for lineage in sorted(view.workers):
        w = view.workers[lineage]
        status: str
        if w.ended is not None:
            status = w.ended.outcome
        elif w.waiting:
            status = "waiting"
        elif w.sandbox_id is not None:
            status = "running"
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
    return CellStatus(
        cell=cell,
        position=max(view.position, resources.position),
        caps={str(k): v for k, v in state.caps.items()},
        holders={str(k): sorted(v) for k, v in state.holders.items() if v},
        queued=list(state.queued[ResourceClass.PROCESSING]),
        workers=tuple(r for r in tree_rows(view, resources, cell) if r.status != "exited"),
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
