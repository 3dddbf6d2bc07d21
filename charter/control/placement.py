"""Placement: which cell each child of a fan-out runs on (docs/fabric.md).

Several cells (``charter cell run`` processes, one per host) follow one PostgreSQL
journal. A fan-out decides, in the same append as its grants, leases and slots, the
cell each child is scheduled on (``WorkerScheduled.cell``, then its ``SlotAdmitted`` or
``SlotQueued`` on that cell's stream): the placement is journaled, and pinned to every
cell stream it read, so two fan-outs never take one last slot.

The rule (:func:`place`), for each child in order:

1. a child whose worker names a cell (``WorkerSpec.cell``) goes to that cell, live or
   not (it queues there until that cell runs and has room);
2. a child whose worker asks a class of cell (``WorkerSpec.cell_class``) goes, among
   the *live* cells started with that class (``CellStarted.classes``), to the one with
   the most free processing slots, ties by id; none free: the one of them with the
   fewest queued (ties by id). No live cell has the class: the whole fan-out is
   refused (:class:`NoCellOfClassError`), never parked on a cell that cannot run it;
3. otherwise, among the *live* cells (configured with a processing cap, their newest
   incarnation's claim not lapsed), whatever their classes, the one with the most free
   processing slots (its cap now, less the slots held, less the workers queued there,
   less the children this fan-out already placed there); ties by the cell's id. When
   none has a free slot, the live cell with the fewest queued (ties by id) queues it;
4. with no live cell, the spawning service's own cell (``settings.cell``), as with one
   cell: the child queues there until that cell runs.

A cell's liveness is its claim (docs/cell.md, "Gone by time"), folded here from
``CellStarted`` and ``CellClaimRenewed`` (:class:`Liveness`). A cell found gone by a
live peer is reaped by it (``charter/runner/_reap.py``): its started workers failed,
the others moved by this same rule (:meth:`charter.control.SpawnService.move_off`),
except those whose worker asked for that cell, and those asking a class no other live
cell has: they wait on the gone cell's queue until a cell of their class is live (then
a peer moves them) or the gone cell runs again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from charter.control.errors import NoCellOfClassError
from charter.control.workers import CellClaimRenewed, CellStarted
from charter.core.events import Event
from charter.ledger import JournalFold

__all__ = ["Ask", "CellRoom", "Liveness", "place"]


class Liveness(JournalFold):
    """Each cell's newest incarnation and its claim: live while the claim holds. Plain
    data (it is saved in the views' snapshot): per cell, its newest incarnation, host,
    whether a peer reaped it, and the claim's end."""

    types = (CellStarted.type_name, CellClaimRenewed.type_name)

    def __init__(self) -> None:
        super().__init__()
        self.incarnation: dict[str, int] = {}
        self.host: dict[str, str] = {}
        self.reaped: dict[str, bool] = {}
        self.until: dict[str, int | None] = {}
        self.classes: dict[str, tuple[str, ...]] = {}

    def apply(self, event: Event, position: int, at_ms: int) -> None:
        del position, at_ms
        if isinstance(event, CellStarted):
            self.incarnation[event.cell] = event.incarnation
            self.host[event.cell] = event.host
            self.reaped[event.cell] = event.reaped_by is not None
            self.until[event.cell] = event.claim_until_ms
            self.classes[event.cell] = event.classes
        elif (
            isinstance(event, CellClaimRenewed)
            and self.incarnation.get(event.cell) == event.incarnation
        ):
            self.until[event.cell] = event.until_ms

    def live(self, cell: str, at_ms: int) -> bool:
        """Whether ``cell``'s newest incarnation holds its claim at ``at_ms`` (one
        written before claims existed, with no bound, counts as live). A peer reaping a
        gone cell holds its claim but runs nothing there: not live."""
        if cell not in self.incarnation or self.reaped[cell]:
            return False
        until = self.until.get(cell)
        return until is None or at_ms < until

    def live_cells(self, at_ms: int) -> list[str]:
        return sorted(c for c in self.incarnation if self.live(c, at_ms))

    def live_classes(self, at_ms: int) -> frozenset[str]:
        """Every class some live cell has: the classes a worker may be placed by."""
        return frozenset(k for c in self.live_cells(at_ms) for k in self.classes.get(c, ()))

    def peers_on_host(self, cell: str, at_ms: int) -> int:
        """How many other live cells run on ``cell``'s host (its newest incarnation's):
        the adaptive cap's ``live_peers``, since they share its cores."""
        host = self.host.get(cell)
        if host is None:
            return 0
        return sum(
            1
            for other, on in self.host.items()
            if other != cell and on == host and self.live(other, at_ms)
        )


@dataclass
class CellRoom:
    """One live cell as a placement sees it: its free processing slots, its queue and
    the classes its newest incarnation started with."""

    cell: str
    free: int
    queued: int
    classes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Ask:
    """What a child's worker asks of its placement: a cell (``WorkerSpec.cell``), a
    class of cell (``WorkerSpec.cell_class``), or neither (never both)."""

    cell: str | None = None
    cell_class: str | None = None


def place(requested: Sequence[Ask], live: Sequence[CellRoom], fallback: str) -> list[str]:
    """The cell of each child (``requested[i]``: what its worker asks), by the rule in
    the module docstring; raises :class:`NoCellOfClassError` when a child asks a class
    no live cell has. Pure: ``live`` is updated only in a copy."""
    rooms = {r.cell: CellRoom(r.cell, r.free, r.queued, r.classes) for r in live}
    chosen: list[str] = []
    for asked in requested:
        if asked.cell is not None:
            chosen.append(asked.cell)
            if asked.cell in rooms:
                _take(rooms[asked.cell])
            continue
        among = list(rooms.values())
        if asked.cell_class is not None:
            among = [r for r in among if asked.cell_class in r.classes]
            if not among:
                raise NoCellOfClassError(
                    f"no live cell has class {asked.cell_class!r}; start one with "
                    f"`charter cell run --id NAME --class {asked.cell_class}`"
                )
        if not among:
            chosen.append(fallback)
            continue
        free = [r for r in among if r.free > 0]
        if free:
            best = min(free, key=lambda r: (-r.free, r.cell))
        else:
            best = min(among, key=lambda r: (r.queued, r.cell))
        _take(best)
        chosen.append(best.cell)
    return chosen


def _take(room: CellRoom) -> None:
    if room.free > 0:
        room.free -= 1
    else:
        room.queued += 1
