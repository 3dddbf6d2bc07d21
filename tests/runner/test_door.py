"""The door: workers fan out, wait and answer through it; identity comes from the
kernel; bad frames, floods and foreign requests get error replies."""

from __future__ import annotations

import json
from pathlib import Path

from charter.runner.events import WorkerEnded, WorkerResult
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import COORDINATOR, python


def test_a_coordinator_fans_out_through_its_door_and_merges(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=2) as charter:
        result = fan_out(charter, 1, python(COORDINATOR, "3"), fanout=10, depth=2)
        (coordinator,) = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell)
        entries = list(charter.journal.entries())
        ended = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        assert len(ended) == 4, ended
        assert all(x.outcome == "exited" and x.exit_code == 0 for x in ended.values()), ended
        results = {
            e.event.lineage: e.event.text for e in entries if isinstance(e.event, WorkerResult)
        }
        assert json.loads(results[coordinator]) == {"sum": 0 + 1 + 2, "statuses": ["exited"]}
        history = journal_history(charter.journal)
        assert check_history(history).problems == []
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
