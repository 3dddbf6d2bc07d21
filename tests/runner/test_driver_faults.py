"""A fault at any of a worker driver's appends never wedges the cell: an append whose
outcome is unknown (committed or not) or that failed outright is settled on a fresh
read of the journal, the worker ends exactly once, its slot goes back, and the worker
queued behind it runs (real sandboxes, both backends)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from charter.budgets import ResourceClass
from charter.control import WorkerSpec
from charter.ledger import AppendFailedError, OutcomeUnknownError
from charter.runner.events import WorkerEnded
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise

# The driver's appends, named by an event each carries.
APPENDS = ("SandboxExited", "WorkerResult", "UsageRecorded", "WorkerEnded")
FAULTS = ("unknown-after-commit", "unknown-before-commit", "failed")


def _inject(journal: Any, monkeypatch: pytest.MonkeyPatch, kind: str, fault: str) -> list[int]:
    """Make the first append carrying a ``kind`` event fail as ``fault``; returns a
    list that holds 1 once it has."""
    real = journal.append
    fired: list[int] = []

    def append(events: Any, **kwargs: Any) -> Any:
        batch = list(events)
        if not fired and any(type(e).type_name == kind for e in batch):
            fired.append(1)
            if fault == "failed":
                raise AppendFailedError("injected: the journal refused the append")
            if fault == "unknown-after-commit":
                real(batch, **kwargs)
            raise OutcomeUnknownError("injected: the commit's outcome is unknown", batch="x")
        return real(batch, **kwargs)

    monkeypatch.setattr(journal, "append", append)
    return fired


@pytest.mark.sandbox
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("kind", APPENDS)
def test_a_fault_at_a_drivers_append_is_settled_and_the_cell_goes_on(
    journal_url: str,
    tmp_path: Path,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    fault: str,
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        echo = WorkerSpec(argv=("/bin/echo", "answer"))
        result = fan_out(charter, 2, echo)  # one slot: the second waits for the first
        fired = _inject(charter.journal, monkeypatch, kind, fault)
        cell = make_cell(charter, None, state_dir)
        with running(cell):
            until_idle(cell, 60)  # a wedged driver never gets here
        monkeypatch.undo()
        assert fired == [1]
        entries = list(charter.journal.entries())
        ended = Counter(e.event.lineage for e in entries if isinstance(e.event, WorkerEnded))
        assert ended == Counter({str(c.lineage): 1 for c in result.children}), ended
        cell.refresh()
        state = cell.resources.cells.get(charter.settings.cell)
        assert not any(state.holders[r] for r in ResourceClass), state.holders
        assert not state.queued[ResourceClass.PROCESSING]
        history = journal_history(charter.journal)
        assert check_history(history).problems == []
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
