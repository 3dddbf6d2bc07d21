"""Lifecycles: a waiting coordinator holds a coordination slot, not a processing one,
so a tree deeper than the processing cap completes; a parent that stops waiting (it
dies, or its wait times out) has every descendant killed, each kill journaled first."""

from __future__ import annotations

import time
from pathlib import Path

from charter.app import Charter
from charter.budgets import ResourceClass, SlotAdmitted, SlotReleased
from charter.runner import Cell, kill_uid
from charter.runner.events import (
    WorkerEnded,
    WorkerKilled,
    WorkerResult,
    WorkerStarted,
    WorkerWaiting,
)
from charter.sandbox import SandboxExited, SandboxLeased
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import CHAIN, LINGER, python
from tests.runner.test_crash import _none_alive


def _settled(charter: Charter) -> None:
    history = journal_history(charter.journal)
    assert check_history(history).problems == []
    assert check_workers(history).problems == []
    assert check_settled(history).problems == []


def test_a_tree_deeper_than_the_processing_cap_completes(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1, coordination=4) as charter:
        result = fan_out(charter, 1, python(CHAIN, "3"), fanout=10, depth=4)
        (top,) = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell)
        entries = list(charter.journal.entries())
        results = {
            e.event.lineage: e.event.text for e in entries if isinstance(e.event, WorkerResult)
        }
        assert results[top] == "leaf<1<2<3"
        ended = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
        assert [x.outcome for x in ended] == ["exited"] * 4
        # Each wait gave back processing and took coordination in the same commit.
        waits = [e for e in entries if isinstance(e.event, WorkerWaiting)]
        assert len(waits) == 3
        by_position = {e.position: e.event for e in entries}
        for wait in waits:
            lineage = wait.event.lineage
            same_commit = [
                by_position[p] for p in (wait.position + 1, wait.position + 2) if p in by_position
            ]
            assert (
                SlotReleased(cell="local", lineage=lineage, resource=ResourceClass.PROCESSING)
                in same_commit
            )
            admitted = [x for x in same_commit if isinstance(x, SlotAdmitted)]
            assert [(x.lineage, x.resource) for x in admitted] == [
                (lineage, ResourceClass.COORDINATION)
            ]
        _settled(charter)


def _started(charter: Charter, lineage: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(
            isinstance(e.event, WorkerStarted) and e.event.lineage == lineage
            for e in charter.journal.entries()
        ):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{lineage} did not start")


def _kills_before_exits(charter: Charter, lineages: list[str]) -> None:
    entries = list(charter.journal.entries())
    killed = {e.event.lineage: e.position for e in entries if isinstance(e.event, WorkerKilled)}
    sandbox = {
        e.event.lineage: e.event.sandbox_id for e in entries if isinstance(e.event, WorkerStarted)
    }
    exited = {e.event.sandbox_id: e.position for e in entries if isinstance(e.event, SandboxExited)}
    ended = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
    for lineage in lineages:
        assert ended[lineage].outcome == "killed"
        assert killed[lineage] < exited[sandbox[lineage]]
    uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}
    assert _none_alive(uids) == []


def test_a_parent_that_dies_has_its_descendants_killed_first_journaled(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=4, coordination=4) as charter:
        result = fan_out(charter, 1, python(LINGER, "2", "3600"), fanout=10, depth=4)
        (top,) = (str(c.lineage) for c in result.children)
        child, grandchild = f"{top}/sa-1", f"{top}/sa-1/sa-1"
        cell: Cell
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            _started(charter, grandchild)
            # The top coordinator dies (as a crash would kill it), not through the cell.
            uid = next(
                e.event.host_uid
                for e in charter.journal.entries()
                if isinstance(e.event, SandboxLeased) and str(e.event.lineage) == top
            )
            assert kill_uid(uid) > 0
            until_idle(cell)
        entries = list(charter.journal.entries())
        ended = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        assert ended[top].outcome == "signalled"  # not the cell's kill: a crash's
        assert ended[top].signal == 9  # it died of the SIGKILL
        _kills_before_exits(charter, [child, grandchild])
        _settled(charter)


def test_a_wait_that_times_out_kills_the_children(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=4, coordination=4) as charter:
        result = fan_out(charter, 1, python(LINGER, "1", "3"), fanout=10, depth=4)
        (top,) = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell)
        entries = list(charter.journal.entries())
        results = {
            e.event.lineage: e.event.text for e in entries if isinstance(e.event, WorkerResult)
        }
        assert results[top] == "gave up waiting"
        ended = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        assert ended[top].outcome == "exited"
        child = f"{top}/sa-1"
        assert ended[child].outcome == "killed"
        if any(isinstance(e.event, WorkerStarted) and e.event.lineage == child for e in entries):
            _kills_before_exits(charter, [child])
        _settled(charter)
