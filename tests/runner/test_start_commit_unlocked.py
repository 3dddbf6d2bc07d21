"""A worker's start commits with the views' lock let go of (another worker's end commits
meanwhile), and the start/kill invariants hold across that window, each race forced
with events (no sleeps): a kill committed while the start is on its way to the journal
refuses the start (the worker never starts, ends killed, its lease and slot back); a
kill committed just after the start, and carried out by another thread before the
start's thread held the sandbox, still kills the worker before it runs on (real
sandboxes, both backends)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from charter.app import Charter
from charter.control import WorkerSpec
from charter.core import Event
from charter.runner import Cell
from charter.runner.events import WorkerEnded, WorkerStarted
from tests.invariants import check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, until_idle
from tests.runner.conftest import initialise

WAIT_S = 60  # a bound on each wait for the other thread, never reached when it holds
SLEEPER = WorkerSpec(argv=("/bin/sleep", "600"))  # ends early only if killed


def _hold_the_start(
    charter: Charter, monkeypatch: pytest.MonkeyPatch, *, after: bool
) -> tuple[threading.Event, threading.Event]:
    """Stop the thread appending a ``WorkerStarted`` just before its append (``after``
    False) or just after it committed (True), until ``go`` is set; ``there`` is set
    once it is stopped."""
    there, go = threading.Event(), threading.Event()
    real: Callable[..., Any] = charter.journal.append

    def append(events: Sequence[Event], **kwargs: Any) -> Any:
        starts = any(isinstance(e, WorkerStarted) for e in events) and not go.is_set()
        if starts and not after:
            there.set()
            assert go.wait(WAIT_S)
        committed = real(events, **kwargs)
        if starts and after:
            there.set()
            assert go.wait(WAIT_S)
        return committed

    monkeypatch.setattr(charter.journal, "append", append)
    return there, go


def _in_thread(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def _kill_while_held(cell: Cell, lineage: str, there: threading.Event) -> None:
    """Once the start's thread is stopped at its commit, kill ``lineage`` from another
    thread: it must not wait for the start (the views' lock is not held meanwhile)."""
    assert there.wait(WAIT_S), "the start never reached its commit"
    killer = _in_thread(lambda: cell.kill(lineage, "killed while its start commits"))
    killer.join(WAIT_S)
    assert not killer.is_alive(), "the kill waited for the start's commit (lock held)"


def _ends(charter: Charter) -> dict[str, WorkerEnded]:
    return {
        e.event.lineage: e.event
        for e in charter.journal.entries(types=("WorkerEnded",))
        if isinstance(e.event, WorkerEnded)
    }


@pytest.mark.sandbox
def test_a_kill_committed_while_the_start_commits_refuses_the_start(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        (lineage,) = (str(c.lineage) for c in fan_out(charter, 1, SLEEPER).children)
        cell = make_cell(charter, None, state_dir)
        cell.open()
        try:
            there, go = _hold_the_start(charter, monkeypatch, after=False)
            stepped: list[int] = []
            stepper = _in_thread(lambda: stepped.append(cell.step()))
            _kill_while_held(cell, lineage, there)
            go.set()  # the start now reaches the journal, after the kill
            stepper.join(WAIT_S)
            assert stepped == [0]  # refused: its worker stream moved
            until_idle(cell, WAIT_S)
            assert cell.pool is not None
            assert cell.pool.leased == 0  # the slot leased for it went back
        finally:
            cell.close()
        assert list(charter.journal.entries(types=("WorkerStarted", "SandboxStarted"))) == []
        assert _ends(charter)[lineage].outcome == "killed"
        history = journal_history(charter.journal)
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []


@pytest.mark.sandbox
def test_a_kill_carried_out_before_the_start_held_its_sandbox_still_kills_it(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        (lineage,) = (str(c.lineage) for c in fan_out(charter, 1, SLEEPER).children)
        cell = make_cell(charter, None, state_dir)
        cell.open()
        try:
            there, go = _hold_the_start(charter, monkeypatch, after=True)
            stepped: list[int] = []
            stepper = _in_thread(lambda: stepped.append(cell.step()))
            # The kill folds the committed start and is carried out while the
            # start's thread has not held the sandbox yet (nothing to send it to).
            _kill_while_held(cell, lineage, there)
            assert cell.driver is not None
            assert not cell.driver.holds(lineage)
            go.set()
            stepper.join(WAIT_S)
            assert stepped == [1]
            until_idle(cell, WAIT_S)  # a 600 s sleeper: idle this soon only if killed
        finally:
            cell.close()
        started = list(charter.journal.entries(types=("WorkerStarted",)))
        assert [e.event.lineage for e in started] == [lineage]  # type: ignore[attr-defined]
        end = _ends(charter)[lineage]
        assert end.outcome == "killed", end
        history = journal_history(charter.journal)
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
