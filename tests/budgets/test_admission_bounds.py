"""Admission of one holder is idempotent, a slot's release that loses races retries
instead of leaking the slot, a refused coordinator swap is journaled, and no model
error reaches the caller (issue 21, point 5). SQLite and PostgreSQL, no sleeps: the
races are made by a second writer, at the moment the release has decided."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from charter.budgets import (
    AdmissionRefused,
    AdmissionRefusedError,
    CapInputs,
    Cells,
    ResourceClass,
    SlotAdmitted,
    SlotQueued,
    SlotReleased,
    SlotReleaseRacedError,
)
from charter.control import AdmissionService
from charter.core import BadInputError, StateError
from charter.ledger import Journal
from charter.runner._journal_allowance import JournalAllowance
from charter.runner.events import WorkerWaiting
from charter.runner.requests import WorkerRequests

P, C, E = ResourceClass.PROCESSING, ResourceClass.COORDINATION, ResourceClass.EGRESS
INPUTS = CapInputs(cores=4, failover_reserve=0, load_average=0.0, live_peers=0)


def _events(journal: Journal, kind: str) -> list[Any]:
    return [e.event for e in journal.entries(types=(kind,))]


def _slots(journal: Journal, caps: dict[ResourceClass, int]) -> AdmissionService:
    slots = AdmissionService(journal)
    slots.configure("c", caps, cores=4, failover_reserve=0)
    return slots


# -- one holder, one slot ------------------------------------------------------------------


def test_admitting_one_holder_twice_journals_one_slot(journal_url: str) -> None:
    with Journal.create(journal_url) as journal:
        slots = _slots(journal, {E: 3})
        (admitted,) = slots.admit("c", ["agent:r/x", "agent:r/x"], E)
        assert (admitted.lineage, admitted.occupancy) == ("agent:r/x", 1)
        head = journal.head()
        assert slots.admit("c", ["agent:r/x"], E) == ()  # already held: nothing appended
        assert journal.head() == head
        # Control: another holder is admitted, and counted once each.
        (other,) = slots.admit("c", ["agent:r/y", "agent:r/x"], E)
        assert (other.lineage, other.occupancy) == ("agent:r/y", 2)
        admitted_events = _events(journal, "SlotAdmitted")
        assert [e.lineage for e in admitted_events if isinstance(e, SlotAdmitted)] == [
            "agent:r/x",
            "agent:r/y",
        ]


def test_a_duplicate_does_not_count_against_the_cap() -> None:
    """Two slots left and ``[x, x, y]`` asked for: admitted (it is two holders)."""
    cells = Cells()
    cells.apply(cells.decide_configure("c", {E: 2}, cores=1, failover_reserve=0))
    admitted = cells.decide_admit("c", ["x", "x", "y"], E)
    assert [(a.lineage, a.occupancy) for a in admitted] == [("x", 1), ("y", 2)]
    with pytest.raises(AdmissionRefusedError):  # control: three holders do not fit
        cells.decide_admit("c", ["x", "y", "z"], E)


def test_a_fanout_naming_a_child_twice_places_it_once() -> None:
    cells = Cells()
    cells.apply(cells.decide_configure("c", {P: 1}, cores=4, failover_reserve=0))
    placed = cells.decide_place("c", ["a", "a", "b", "b"], P, INPUTS)
    assert [type(e) for e in placed] == [SlotAdmitted, SlotQueued]
    admitted, queued = placed
    assert isinstance(admitted, SlotAdmitted)
    assert admitted.lineage == "a"
    assert isinstance(queued, SlotQueued)
    assert queued.lineages == ("b",)


# -- a release never leaks a slot ----------------------------------------------------------


def _racing(
    slots: AdmissionService, rival: AdmissionService, losses: int, *, same: bool = False
) -> list[int]:
    """Make ``slots``' next ``losses`` release decisions lose their race: right after
    each decision, ``rival`` commits on the cell (admits and releases another holder,
    or, with ``same``, releases the very slot being released)."""
    decide: Callable[..., SlotReleased] = slots.view.cells.decide_release
    lost = [0]

    def decide_then_race(cell: str, lineage: str, resource: ResourceClass) -> SlotReleased:
        event = decide(cell, lineage, resource)
        if lost[0] < losses:
            lost[0] += 1
            if same:
                rival.release(cell, lineage, resource)
            else:
                rival.admit(cell, ["agent:r/rival"], E)
                rival.release(cell, "agent:r/rival", E)
        return event

    slots.view.cells.decide_release = decide_then_race  # type: ignore[method-assign]
    return lost


def test_a_release_that_loses_many_races_retries_until_it_commits(journal_url: str) -> None:
    """25 lost races: more than the tries after which a release used to give up with
    AppendConflictError (20 before the handlers' one loop, 16 in it: RETRIES), leaving
    the slot held by a worker that was gone."""
    with Journal.create(journal_url) as journal:
        slots = _slots(journal, {E: 2})
        slots.admit("c", ["agent:r/x"], E)
        lost = _racing(slots, AdmissionService(journal), 25)
        slots.release("c", "agent:r/x", E)
        assert lost == [25]
        mine = [e for e in _events(journal, "SlotReleased") if e.lineage == "agent:r/x"]
        assert len(mine) == 1
        assert "agent:r/x" not in slots.view.cells.get("c").holders[E]
        # Control: the freed slot is there to take.
        assert AdmissionService(journal).admit("c", ["agent:r/x2", "agent:r/x3"], E)


def test_a_release_that_lost_to_the_same_release_journals_it_once(journal_url: str) -> None:
    with Journal.create(journal_url) as journal:
        slots = _slots(journal, {E: 2})
        slots.admit("c", ["agent:r/x"], E)
        _racing(slots, AdmissionService(journal), 1, same=True)
        slots.release("c", "agent:r/x", E)  # the rival's release is the one asked for
        assert len(_events(journal, "SlotReleased")) == 1
        # Control: releasing it once more is an error of state, as before.
        with pytest.raises(StateError, match="holds no egress slot"):
            AdmissionService(journal).release("c", "agent:r/x", E)


def test_a_release_that_loses_past_the_time_limit_says_the_slot_is_still_held(
    journal_url: str,
) -> None:
    with Journal.create(journal_url) as journal:
        ticks = iter(range(0, 10_000, 10))  # each look at the clock: 10 s later
        slots = AdmissionService(journal, monotonic=lambda: float(next(ticks)))
        slots.configure("c", {E: 2}, cores=4, failover_reserve=0)
        slots.admit("c", ["agent:r/x"], E)
        _racing(slots, AdmissionService(journal), 1_000)
        with pytest.raises(SlotReleaseRacedError, match="still holds its slot"):
            slots.release("c", "agent:r/x", E)
        fresh = AdmissionService(journal)
        fresh.view.refresh(journal)
        assert "agent:r/x" in fresh.view.cells.get("c").holders[E]
        fresh.release("c", "agent:r/x", E)  # control: retried, it is released


# -- a refused coordinator swap is journaled ------------------------------------------------


def test_a_refused_coordinator_swap_is_journaled_once(journal_url: str) -> None:
    with Journal.create(journal_url) as journal:
        slots = _slots(journal, {P: 2, C: 1})
        slots.admit("c", ["agent:r/a"], C)
        slots.admit("c", ["agent:r/b"], P, INPUTS)
        with pytest.raises(AdmissionRefusedError) as caught:
            slots.wait_on_children("c", "agent:r/b")
        assert caught.value.retry_after_ms > 0
        (refused,) = _events(journal, "AdmissionRefused")
        assert isinstance(refused, AdmissionRefused)
        assert (refused.lineage, refused.resource, refused.cap, refused.occupancy) == (
            "agent:r/b",
            C,
            1,
            1,
        )
        state = slots.view.cells.get("c")
        assert "agent:r/b" in state.holders[P]  # kept its processing slot
        # Control: with the coordination slot free, the swap goes through.
        slots.release("c", "agent:r/a", C)
        slots.wait_on_children("c", "agent:r/b")
        assert "agent:r/b" in slots.view.cells.get("c").holders[C]
        assert len(_events(journal, "AdmissionRefused")) == 1


def test_an_admission_refusal_is_journaled_once_for_the_holder_asked_for(
    journal_url: str,
) -> None:
    with Journal.create(journal_url) as journal:
        slots = _slots(journal, {E: 1})
        slots.admit("c", ["agent:r/a"], E)
        with pytest.raises(AdmissionRefusedError):
            slots.admit("c", ["agent:r/a", "agent:r/b"], E)  # a holds already: b is refused
        (refused,) = _events(journal, "AdmissionRefused")
        assert isinstance(refused, AdmissionRefused)
        assert (refused.lineage, refused.occupancy) == ("agent:r/b", 1)


# -- no model error reaches the caller ------------------------------------------------------


@pytest.mark.parametrize(
    ("caps", "cores"),
    [({P: 2**63}, 2), ({P: -1}, 2), ({P: 1}, 2**63), ({P: 1}, -2), ({P: True}, 2)],
)
def test_configuring_a_cell_with_numbers_no_journal_stores_is_bad_input(
    journal_url: str, caps: dict[ResourceClass, int], cores: int
) -> None:
    with Journal.create(journal_url) as journal:
        slots = AdmissionService(journal)
        with pytest.raises(BadInputError, match="whole number from 0 to"):
            slots.configure("c", caps, cores=cores, failover_reserve=0)
        assert journal.head() is None
        slots.configure("c", {P: 2**63 - 1}, cores=2**63 - 1, failover_reserve=0)  # control


def test_a_lineage_with_a_newline_is_escaped_in_admission_messages(journal_url: str) -> None:
    forged = "agent:r/x\ncharter: admitted"
    with Journal.create(journal_url) as journal:
        slots = _slots(journal, {E: 1})
        with pytest.raises(StateError) as caught:
            slots.release("c", forged, E)
        assert "\n" not in str(caught.value)
        assert "x\\ncharter" in str(caught.value)
        with pytest.raises(StateError) as unknown:
            slots.admit("no\ncell", [forged], E)
        assert "\n" not in str(unknown.value)


class _Cell:
    """What the worker requests' swap uses of its cell, on a real journal."""

    def __init__(self, journal: Journal) -> None:
        self.cell = "c"
        self.admission = AdmissionService(journal)
        self.changed = threading.Condition()
        # The real allowance; a wait's few bytes stay within its floor (no egress used).
        self.journal_allowance = JournalAllowance(self, lambda lineage, at: 0, journal.append)  # type: ignore[arg-type]

    def live(self, lineage: str) -> bool:
        del lineage
        return True

    def wait_on_children(self, lineage: str, waiting: WorkerWaiting) -> None:
        """The cell's worker-facing swap, as :class:`charter.runner.cell.Cell` has it."""
        self.admission.wait_on_children(self.cell, lineage, waiting, self.live)


def test_a_workers_refused_wait_is_journaled_once(journal_url: str) -> None:
    """The runner's caller of the swap (a worker's ``wait`` through the door)."""
    with Journal.create(journal_url) as journal:
        slots = _slots(journal, {P: 2, C: 1})
        slots.admit("c", ["agent:r/a"], C)
        slots.admit("c", ["agent:r/b"], P, INPUTS)
        requests = WorkerRequests(_Cell(journal))  # type: ignore[arg-type]
        with pytest.raises(AdmissionRefusedError):
            requests._swap_for_coordination("agent:r/b", ("agent:r/b/sa-1",), 1.0)
        (refused,) = _events(journal, "AdmissionRefused")
        assert (refused.lineage, refused.resource) == ("agent:r/b", C)
        assert not _events(journal, "WorkerWaiting")
        # Control: with the coordination slot free, the wait is journaled with its swap.
        slots.release("c", "agent:r/a", C)
        requests._swap_for_coordination("agent:r/b", ("agent:r/b/sa-1",), 1.0)
        assert len(_events(journal, "WorkerWaiting")) == 1
        assert len(_events(journal, "AdmissionRefused")) == 1


def test_a_holder_already_admitted_is_not_refused_when_the_cap_fell_below_it() -> None:
    """The adaptive processing cap can fall below the slots held (load rose): asking
    again for a slot already held admits nothing and refuses nothing."""
    cells = Cells()
    cells.apply(cells.decide_configure("c", {P: 2}, cores=4, failover_reserve=0))
    for event in cells.decide_admit("c", ["a", "b"], P, INPUTS):
        cells.apply(event)
    busy = INPUTS.model_copy(update={"load_average": 400.0})
    assert cells.decide_admit("c", ["a", "a"], P, busy) == ()
    assert cells.decide_admit("c", [], P, busy) == ()
    with pytest.raises(AdmissionRefusedError) as caught:  # control: a new holder is not
        cells.decide_admit("c", ["a", "c"], P, busy)
    assert caught.value.refusal is not None
    assert caught.value.refusal.lineage == "c"
