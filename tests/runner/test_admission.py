"""The queue's admissions: never over the cap, first come first served, and a head that
ended while queued is cleared without taking room (pure; no journal, no sandbox)."""

from __future__ import annotations

from charter.budgets import (
    CapInputs,
    CellConfigured,
    Cells,
    ResourceClass,
    SlotAdmitted,
    SlotQueued,
    SlotReleased,
)
from charter.control import queue_admissions

P = ResourceClass.PROCESSING
INPUTS = CapInputs(cores=8, failover_reserve=0, load_average=0.0, live_peers=0)


def cells_with(held: list[str], queued: list[str], cap: int = 2) -> Cells:
    cells = Cells()
    cells.apply(CellConfigured(cell="c", caps=dict.fromkeys(ResourceClass, cap), cores=8,
                               failover_reserve=0))  # fmt: skip
    for i, lineage in enumerate(held):
        cells.apply(SlotAdmitted(cell="c", lineage=lineage, resource=P, cap=cap, occupancy=i + 1))
    if queued:
        cells.apply(SlotQueued(cell="c", lineages=tuple(queued), resource=P, cap=cap,
                               occupancy=len(held)))  # fmt: skip
    return cells


def test_a_full_cell_admits_nobody_until_a_slot_is_freed() -> None:
    cells = cells_with(["a", "b"], ["q1", "q2", "q3"])
    assert queue_admissions(cells, "c", INPUTS, lambda _: True, freed=0) == []
    admitted = queue_admissions(cells, "c", INPUTS, lambda _: True, freed=1)
    assert [(type(e), e.lineage) for e in admitted] == [(SlotAdmitted, "q1")]


def test_a_head_that_ended_while_queued_is_cleared_without_taking_room() -> None:
    cells = cells_with(["a", "b"], ["q1", "q2", "q3"])
    events = queue_admissions(cells, "c", INPUTS, lambda lin: lin != "q2", freed=1, dead={"q1"})
    assert [(type(e).__name__, e.lineage) for e in events] == [
        ("SlotAdmitted", "q1"),
        ("SlotReleased", "q1"),
        ("SlotAdmitted", "q2"),
        ("SlotReleased", "q2"),
        ("SlotAdmitted", "q3"),
    ]
    # Applied after the freed slot's release, they never hold more than the cap.
    cells.apply(SlotReleased(cell="c", lineage="a", resource=P))
    for e in events:
        cells.apply(e)
        assert cells.get("c").occupancy(P) <= 2
    assert list(cells.get("c").queued[P]) == []
    assert cells.get("c").holders[P] == {"b", "q3"}
