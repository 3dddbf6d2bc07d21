"""Who leaves a cell's processing queue now: a pure decision over the folded cells."""

from __future__ import annotations

from collections.abc import Callable, Collection

from charter.budgets import CapInputs, Cells, ResourceClass, SlotAdmitted, SlotReleased
from charter.core import Event

__all__ = ["queue_admissions"]


def queue_admissions(
    cells: Cells,
    cell: str,
    inputs: CapInputs,
    live: Callable[[str], bool],
    *,
    freed: int,
    dead: Collection[str] = (),
) -> list[Event]:
    """Admissions of ``cell``'s processing queue head(s) into the room there is under the
    cap for ``inputs`` (plus ``freed`` slots the same append gives back). A head whose
    worker already ended (``dead``, or not ``live``: killed while queued) is admitted and
    released at once, which clears it from the queue without taking room."""
    state = cells.get(cell)
    cap, used = cells.cap(cell, ResourceClass.PROCESSING, inputs)
    occupancy = state.occupancy(ResourceClass.PROCESSING) - freed
    events: list[Event] = []
    # Only read here, so iterated in place (a copy cost O(queue) on every call).
    for lineage in state.queued[ResourceClass.PROCESSING]:
        if occupancy >= cap:
            break
        events.append(
            SlotAdmitted(
                cell=cell,
                lineage=lineage,
                resource=ResourceClass.PROCESSING,
                cap=cap,
                occupancy=occupancy + 1,
                inputs=used,
            )
        )
        if lineage in dead or not live(lineage):
            events.append(
                SlotReleased(cell=cell, lineage=lineage, resource=ResourceClass.PROCESSING)
            )
        else:
            occupancy += 1
    return events
