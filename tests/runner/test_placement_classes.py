"""Placement by class (docs/fabric.md, rule 2) on a real journal: a worker asking a
class runs only on a live cell started with it (``CellStarted.classes``), by free
slots; a class no live cell has refuses the fan-out (``NoCellOfClassError``, journaled
as ``SpawnRefused`` with nothing minted); a gone cell's class workers move only to a live
cell of their class, and wait on its queue while there is none; the semantic audit is
clean after each (and finds the misplacements: tests/audit/test_rules_cells.py).
SQLite and PostgreSQL."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from charter.app import CellSetup, Charter
from charter.audit.semantic import audit_history
from charter.authority import GateDecided, SpawnRefused
from charter.control import NoCellOfClassError, WorkerLifecycle, WorkerScheduled, WorkerSpec
from charter.control.workers import worker_stream
from charter.core import now_ms
from charter.runner._reap import gone_peers, movable
from charter.runner._view import WorkersView
from tests.runner._support import fan_out
from tests.runner.conftest import initialise, steady

TRUE = WorkerSpec(argv=("/bin/true",))
GPU = TRUE.model_copy(update={"cell_class": "gpu"})


def _live(charter: Charter, cell: str, classes: tuple[str, ...], claim_ms: int = 60_000) -> int:
    """Journal an incarnation of ``cell`` with ``classes`` (as ``cell run --class``
    does); returns when its claim lapses."""
    lifecycle = WorkerLifecycle(
        charter.journal, charter.views, charter.budgets(), charter.admission(), cell
    )
    last = charter.views.liveness.incarnation.get(cell, 0)
    started = lifecycle.begin(
        os.getpid(), socket.gethostname(), claim_ms=claim_ms, last=lambda: (last, None),
        take_over=True, classes=classes,
    )  # fmt: skip
    assert started is not None
    assert started.classes == tuple(sorted(classes))
    assert started.claim_until_ms is not None
    return started.claim_until_ms


def _scheduled(charter: Charter) -> dict[str, WorkerScheduled]:
    """Each worker's newest schedule."""
    return {
        e.event.lineage: e.event
        for e in charter.journal.entries(types=["WorkerScheduled"])
        if isinstance(e.event, WorkerScheduled)
    }


def _clean(charter: Charter) -> None:
    report = audit_history(charter.journal.payloads(None, None))
    assert report.ok, report.findings


def _setup(charter: Charter, *cells: str) -> None:
    charter.host_load = steady
    for cell in cells:  # 8 cores: the live peers on this host leave the cap at 2
        charter.configure_cell(CellSetup(cores=8, processing=2, coordination=1), cell)


def test_a_class_runs_only_on_live_cells_of_it_else_the_fan_out_is_refused(
    journal_url: str, tmp_path: Path
) -> None:
    with initialise(journal_url, tmp_path / "home") as charter:
        _setup(charter, "g1", "g2", "b", "t")
        _live(charter, "g1", ("gpu",))
        _live(charter, "g2", ("cpu", "gpu"))
        _live(charter, "b", ())
        _live(charter, "t", ("tpu",), claim_ms=0)  # gone at once: a class no live cell has
        gpus = fan_out(charter, 6, GPU)
        plain = fan_out(charter, 6, TRUE)
        placed = _scheduled(charter)
        on = {str(c.lineage): placed[str(c.lineage)] for c in gpus.children}
        # by free slots (2 each), ties by id, then the fewest queued: never on b or t
        assert sorted(s.cell for s in on.values()) == ["g1"] * 3 + ["g2"] * 3
        assert {s.cell_class for s in on.values()} == {"gpu"}
        assert len(gpus.admitted) == 4
        assert len(gpus.queued) == 2
        # an unclassed worker goes anywhere live: b has the free slots now
        assert {placed[str(c.lineage)].cell for c in plain.children} >= {"b"}
        assert {placed[str(c.lineage)].cell_class for c in plain.children} == {None}
        _clean(charter)  # positive control

        head = charter.journal.head()[0]
        with pytest.raises(NoCellOfClassError) as refused:
            fan_out(charter, 2, TRUE.model_copy(update={"cell_class": "tpu"}))
        assert refused.value.reason == "no-cell-of-class"
        after = [e.event for e in charter.journal.entries() if e.position > head]
        # the gate's record and the refusal: nothing minted, leased or scheduled
        assert [type(e) for e in after] == [GateDecided, SpawnRefused], after
        journaled = after[-1]
        assert isinstance(journaled, SpawnRefused)
        assert journaled.reason == "no-cell-of-class"
        assert journaled.error == "NoCellOfClassError"
        _clean(charter)


def test_a_gone_cells_class_workers_move_only_to_a_live_cell_of_their_class(
    journal_url: str, tmp_path: Path
) -> None:
    with initialise(journal_url, tmp_path / "home") as charter:
        _setup(charter, "g1", "g2", "b")
        lapses = _live(charter, "g1", ("gpu",), claim_ms=1500)
        _live(charter, "b", ())
        gpus = fan_out(charter, 2, GPU)
        placed = _scheduled(charter)
        assert {placed[str(c.lineage)].cell for c in gpus.children} == {"g1"}
        plain = fan_out(charter, 3, TRUE.model_copy(update={"cell": "g1"}))  # asked: they stay
        deadline = time.monotonic() + 10
        while now_ms() <= lapses:  # g1's claim lapses at a known time: wait for it
            assert time.monotonic() < deadline
            time.sleep(0.02)
        service = charter.spawn_service()

        def moving() -> list[tuple[WorkerScheduled, int]]:
            on_g1 = [s for s in _scheduled(charter).values() if s.cell == "g1" and not s.requested]
            versions = charter.journal.stream_versions([worker_stream(s.lineage) for s in on_g1])
            return [(s, versions[worker_stream(s.lineage)]) for s in on_g1]

        # A peer reaps g1 only for what may move: its gpu workers only while gpu is live.
        view = WorkersView()
        view.refresh(charter.journal)
        at = now_ms()
        assert charter.views.liveness.live_classes(at) == frozenset()
        assert gone_peers("b", view, at, frozenset()) == []
        assert movable("g1", view, frozenset()) == []
        assert gone_peers("b", view, at, frozenset({"gpu"})) == ["g1"]
        assert len(movable("g1", view, frozenset({"gpu"}))) == 2
        # No live cell of gpu (b has none): they wait on g1's queue; nothing is journaled.
        head = charter.journal.head()[0]
        assert service.move_off("g1", moving, {}) == 0
        assert charter.journal.head()[0] == head
        _live(charter, "g2", ("gpu",))
        assert service.move_off("g1", moving, {}) == 2  # now to the live gpu cell
        placed = _scheduled(charter)
        assert {placed[str(c.lineage)].cell for c in gpus.children} == {"g2"}
        assert {placed[str(c.lineage)].cell_class for c in gpus.children} == {"gpu"}
        assert {placed[str(c.lineage)].cell for c in plain.children} == {"g1"}
        _clean(charter)


def test_a_cell_restarted_without_the_class_before_the_commit_decides_it_again(
    journal_url: str, tmp_path: Path
) -> None:
    """The placement is pinned to the chosen cells' run streams: g1 restarting without
    ``gpu`` between the fan-out's read and its commit makes it decide again (on g2
    only), so no class worker is scheduled on a cell that lost its class."""
    with initialise(journal_url, tmp_path / "home") as charter:
        _setup(charter, "g1", "g2")
        _live(charter, "g1", ("gpu",))
        _live(charter, "g2", ("gpu",))
        journal = charter.journal
        append = journal.append
        raced: list[int] = []

        def racing_append(events: list, **options: object) -> object:
            if not raced and any(isinstance(e, WorkerScheduled) for e in events):
                raced.append(1)  # once: g1 restarts with no class, after the read
                _live(charter, "g1", ())
            return append(events, **options)

        journal.append = racing_append  # type: ignore[method-assign]
        try:
            gpus = fan_out(charter, 4, GPU)
        finally:
            del journal.append
        assert raced
        placed = _scheduled(charter)
        assert {placed[str(c.lineage)].cell for c in gpus.children} == {"g2"}
        _clean(charter)
