"""Placement (charter/control/placement.py, docs/fabric.md): the rule, pure; then on a
real journal, a fan-out placed across two live cells by free slots (ties by id), a
worker's requested cell honoured, a cell whose claim lapsed left out, no live cell at
all falling back to the service's own, and each admission's cap counting the live
peers on its host (journaled with it)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from charter.app import CellSetup, Charter
from charter.budgets import SlotAdmitted, SlotQueued
from charter.control import NoCellOfClassError, WorkerLifecycle, WorkerScheduled, WorkerSpec
from charter.control.placement import Ask, CellRoom, place
from charter.core import KeyStore
from tests.runner._support import fan_out
from tests.runner.conftest import initialise, steady

TRUE = WorkerSpec(argv=("/bin/true",))
ANY = Ask()


def test_the_most_free_slots_first_ties_by_id_then_the_shortest_queue() -> None:
    rooms = [CellRoom("b", 2, 0), CellRoom("a", 2, 0), CellRoom("c", 0, 5)]
    assert place([ANY] * 4, rooms, "home") == ["a", "b", "a", "b"]
    # all full: the fewest queued, ties by id
    assert place([ANY] * 3, [CellRoom("b", 0, 1), CellRoom("a", 0, 2)], "home") == ["b", "a", "b"]
    # asked for: there, whatever its room (and it counts against that room)
    assert place([Ask("c"), ANY, ANY], rooms, "home") == ["c", "a", "b"]
    # no live cell: the service's own
    assert place([ANY, ANY], [], "home") == ["home", "home"]
    assert rooms[0].free == 2  # pure: the caller's rooms are untouched


def test_a_class_goes_to_the_live_cells_of_that_class_by_the_same_rule() -> None:
    gpu, cpu = frozenset({"gpu"}), frozenset({"cpu"})
    rooms = [
        CellRoom("a", 5, 0, cpu),  # the most free slots, but not a gpu cell
        CellRoom("g2", 1, 0, gpu | cpu),
        CellRoom("g1", 1, 0, gpu),
        CellRoom("z", 0, 0),
    ]
    gpus = Ask(cell_class="gpu")
    # the gpu cells by free slots, ties by id; then, full, the fewest queued (ties by id)
    assert place([gpus] * 4, rooms, "home") == ["g1", "g2", "g1", "g2"]
    # a class child's slot counts against the room the unclassed children see
    assert place([Ask(cell_class="cpu"), ANY, ANY], rooms, "home") == ["a", "a", "a"]
    assert place([gpus, ANY], [CellRoom("g1", 1, 0, gpu), CellRoom("b", 1, 0)], "home") == [
        "g1",
        "b",
    ]
    # an unclassed child goes anywhere, class cells included
    assert place([ANY], [CellRoom("g1", 3, 0, gpu), CellRoom("b", 1, 0)], "home") == ["g1"]
    # a class no live cell has: refused, even where an unclassed child would fall back
    for live in (rooms, []):
        with pytest.raises(NoCellOfClassError) as refused:
            place([ANY, Ask(cell_class="tpu")], live, "home")
        assert refused.value.reason == "no-cell-of-class"
        assert "tpu" in str(refused.value)
    assert rooms[1].free == 1  # pure


def _live(charter: Charter, cell: str, *, claim_ms: int = 60_000) -> None:
    """Journal an incarnation of ``cell`` holding a claim (as ``cell run`` does)."""
    lifecycle = WorkerLifecycle(
        charter.journal, charter.views, charter.budgets(), charter.admission(), cell
    )
    started = lifecycle.begin(
        os.getpid(), socket.gethostname(), claim_ms=claim_ms, last=lambda: (0, None)
    )
    assert started is not None


def _placed(charter: Charter, first: int) -> tuple[dict[str, str], list[object]]:
    entries = [e for e in charter.journal.entries() if e.position > first]
    cells = {e.event.lineage: e.event.cell for e in entries if isinstance(e.event, WorkerScheduled)}
    slots = [e.event for e in entries if isinstance(e.event, SlotAdmitted | SlotQueued)]
    return cells, slots


def test_a_fan_out_is_placed_across_the_live_cells(journal_url: str, tmp_path: Path) -> None:
    with initialise(journal_url, tmp_path / "home") as charter:
        charter.host_load = steady
        for cell in ("a", "b", "gone"):
            charter.configure_cell(CellSetup(cores=4, processing=2, coordination=1), cell)
        # no live cell: the service's own (the settings' cell), as with one cell
        head = charter.journal.head()[0]
        fan_out(charter, 2, TRUE)
        cells, _ = _placed(charter, head)
        assert set(cells.values()) == {charter.settings.cell}
        _live(charter, "a")
        _live(charter, "b")
        _live(charter, "gone", claim_ms=0)  # its claim lapsed at once: gone by time
        head = charter.journal.head()[0]
        fan_out(charter, 6, TRUE)
        cells, slots = _placed(charter, head)
        # 4 cores less 1 live peer on this host: a cap of 2 on each of a and b
        by_cell = sorted(cells.values())
        assert by_cell == ["a", "a", "a", "b", "b", "b"]
        admitted = [s for s in slots if isinstance(s, SlotAdmitted)]
        assert sorted(s.cell for s in admitted) == ["a", "a", "b", "b"]
        assert {s.cap for s in admitted} == {2}
        assert {s.inputs.live_peers for s in admitted if s.inputs} == {1}
        queued = [s for s in slots if isinstance(s, SlotQueued)]
        assert sorted(q.cell for q in queued) == ["a", "b"]
        # a worker that asks for a cell runs there, even a gone one (it queues there)
        head = charter.journal.head()[0]
        fan_out(charter, 2, TRUE.model_copy(update={"cell": "gone"}))
        cells, slots = _placed(charter, head)
        assert set(cells.values()) == {"gone"}
        scheduled = [
            e.event for e in charter.journal.entries()
            if e.position > head and isinstance(e.event, WorkerScheduled)
        ]  # fmt: skip
        assert all(s.requested for s in scheduled)
        assert slots
        assert all(s.cell == "gone" for s in slots)  # type: ignore[attr-defined]


def test_a_processs_first_fan_out_places_on_every_live_cell(
    journal_url: str, tmp_path: Path
) -> None:
    """A new process's views know no cell before their first refresh, and a fan-out
    names the cells it reads on the views as they stand: the first one, finding cells
    on the views it just refreshed that it did not read, is decided again with their
    streams read (and pinned), so it places on them as any later fan-out does."""
    home = tmp_path / "home"
    with initialise(journal_url, home) as charter:
        for cell in ("a", "b"):
            charter.configure_cell(CellSetup(cores=4, processing=2, coordination=1), cell)
            _live(charter, cell)
    with Charter.open(journal_url, keys=KeyStore(home)) as fresh:
        fresh.host_load = steady
        assert fresh.views.resources.cells.cells() == {}  # nothing folded yet
        head = fresh.journal.head()[0]
        fan_out(fresh, 4, TRUE)
        cells, slots = _placed(fresh, head)
        assert sorted(cells.values()) == ["a", "a", "b", "b"]
        assert sorted(s.cell for s in slots if isinstance(s, SlotAdmitted)) == ["a", "a", "b", "b"]
