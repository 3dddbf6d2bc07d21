"""What a cell is doing, read from the journal: each worker's status and budget burn,
the cell's caps, slot holders and queue (``charter cell status``, the demo's tree)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from charter.budgets import LedgerState, ResourceClass
from charter.control import ResourceView, WorkerStatus, host_cap_inputs
from charter.core import Budget, now_ms
from charter.ledger import Journal
from charter.runner._view import WorkerRecord, WorkersView
from charter.runner.events import CellStarted

__all__ = [
    "CellStatus",
    "Row",
    "WorkerWatch",
    "cell_status",
    "latest_incarnation",
    "running_below",
    "tree_rows",
]


@dataclass(frozen=True)
class Row:
    """One worker, with its status in the one vocabulary the projections share
    (:data:`charter.control.WorkerStatus`): ``queued``, ``admitted``, ``running``,
    ``waiting``, or how it ended."""

    lineage: str
    depth: int
    status: WorkerStatus
    burn: str
    why: str = ""  # why a queued or admitted worker is not running yet

    def to_json(self) -> dict[str, Any]:
        out = {"lineage": self.lineage, "status": self.status, "burn": self.burn}
        return out | ({"why": self.why} if self.why else {})


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
    waits: str = ""  # why its queue waits, if it does

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "position": self.position,
            "incarnation": self.incarnation,
            "state": self.state,
            "claim_until_ms": self.claim_until_ms,
            "read_at_ms": self.read_at_ms,
            "waits": self.waits,
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
        status = _status(w, queued, coordinating, gone=gone)
        burn = ""
        charged = _charged(view, resources, lineage)
        if charged is not None:
            own, whole, ledger = charged
            cpu_ms, wall_ms, live = own.cpu_ms, own.wall_ms, ""
            if w.ended is None and w.sampled is not None:  # charged only at its end
                cpu_ms, wall_ms, live = w.sampled.cpu_ms, w.sampled.wall_ms, " so far"
            burn = (
                f"cpu {cpu_ms / 1000:.2f}s{live} of {whole.cpu_ms // 1000}s, "
                f"wall {wall_ms / 1000:.1f}s{live} of {whole.wall_ms // 1000}s"
            )
            if ledger is not None and ledger.active(now) and ledger.children:
                held = whole.cpu_ms - resources.book.remaining(lineage, now).cpu_ms
                burn += f" (cpu {held // 1000}s out to children)"
        rows.append(Row(lineage, lineage.count("/"), status, burn))
    return rows


def _charged(
    view: WorkersView, resources: ResourceView, lineage: str
) -> tuple[Budget, Budget, LedgerState | None] | None:
    """What ``lineage``'s lease was charged and holds, and its ledger: from the lease
    book, or, once the lease ended and left it, from the worker's record (its charges)
    and its grant (which says what its lease held); None if neither knows."""
    if lineage in resources.book:
        ledger = resources.book.get(lineage)
        return ledger.spent, ledger.allocation, ledger
    w, minted = view.workers[lineage], view.grants.get(lineage)
    if w.charged is None or minted is None:
        return None
    return w.charged, minted.sealed().grant.terms.budget, None


def _status(
    w: WorkerRecord, queued: Collection[str], coordinating: Collection[str], *, gone: bool
) -> WorkerStatus:
    """``w``'s status in the one vocabulary, given its cell's processing queue and
    coordination holders, and whether its cell is gone by time."""
    if w.ended is not None:
        return w.ended.outcome
    if w.sandbox_id is not None and gone:
        return "lost"  # its cell is gone by time: the next incarnation fails it
    if w.sandbox_id is not None:
        # Waiting on its children: from its swap to a coordination slot until it holds
        # a processing slot again (queued for one meanwhile, it still waits).
        waits = w.waiting and (w.lineage in coordinating or w.lineage in queued)
        return "waiting" if waits else "running"
    return "queued" if w.lineage in queued else "admitted"


class WorkerWatch:
    """One worker's status as the journal moves on, each look read incrementally."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.view, self.resources = WorkersView(), ResourceView()

    def status(self, lineage: str) -> WorkerStatus | None:
        """``lineage``'s status now (None: nothing was scheduled for it)."""
        self.view.refresh(self.journal)
        self.resources.refresh(self.journal)
        w = self.view.workers.get(lineage)
        if w is None:
            return None
        cell = w.scheduled.cell
        state = self.resources.cells.cells().get(cell)
        queued = state.queued[ResourceClass.PROCESSING] if state is not None else {}
        coordinating = state.holders[ResourceClass.COORDINATION] if state is not None else set()
        return _status(w, queued, coordinating, gone=self.view.gone(cell, now_ms()))


def cell_status(journal: Journal, cell: str) -> CellStatus:
    """The cell as the journal stands now."""
    view, resources = WorkersView(), ResourceView()
    view.refresh(journal)
    resources.refresh(journal)
    state = resources.cells.get(cell)
    at = now_ms()
    incarnation, until = view.claim(cell)
    liveness = "never-run" if not incarnation else "gone" if view.gone(cell, at) else "live"
    waits = _why_waiting(resources, cell, liveness)
    why = {"queued": waits, "admitted": _ADMITTED_WHY}
    rows = [replace(r, why=why.get(r.status, "")) for r in tree_rows(view, resources, cell, at)]
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
        waits=waits,
    )


_ADMITTED_WHY = "it holds a processing slot: the cell starts it at its next step"


def _why_waiting(resources: ResourceView, cell: str, liveness: str) -> str:
    """Why ``cell``'s processing queue waits ("" when nothing queues): no incarnation
    runs the cell, or every slot under the cap (as the host's load sets it now) is
    held."""
    state = resources.cells.get(cell)
    queued = state.queued[ResourceClass.PROCESSING]
    if not queued:
        return ""
    if liveness != "live":
        what = "no incarnation has run it" if liveness == "never-run" else "its cell is gone"
        return f"{what}: `charter cell run` admits and starts them"
    if not state.caps:
        return "the cell has no caps: `charter cell configure` sets them"
    cap, _ = resources.cells.cap(
        cell, ResourceClass.PROCESSING, host_cap_inputs(state.cores, state.failover_reserve)
    )
    held = state.occupancy(ResourceClass.PROCESSING)
    configured = state.caps.get(ResourceClass.PROCESSING, 0)
    if held >= cap:
        lowered = f" (the host's load lowers it from {configured})" if cap < configured else ""
        return f"every processing slot is held: {held} of a cap of {cap}{lowered}"
    return f"{cap - held} processing slot(s) free: the cell admits the queue at its next step"


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
