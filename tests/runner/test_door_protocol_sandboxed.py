"""Issue 23 points 4 and 8 from a real sandbox, through a real cell's door (the frame by
frame vectors are tests/runner/test_door_protocol.py, against a stand-in cell): a lone
surrogate in ``result.text`` is a parse error and the connection lives, nothing
journaled for it; ids that are no JSON-RPC id come back -32600 with a null id and
strict JSON; a missing method is -32600; a batch is served; a notification gets no
reply and is executed (the worker's journaled result came by one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from charter.runner.door import INVALID_REQUEST, PARSE_ERROR
from charter.runner.events import WorkerEnded, WorkerResult
from tests.invariants import check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import PROTOCOL, python

pytestmark = pytest.mark.sandbox


def test_a_sandboxed_worker_speaking_raw_json_rpc_gets_the_spec(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        result = fan_out(charter, 1, python(PROTOCOL))
        (worker,) = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell)
        entries = list(charter.journal.entries())
        results = [e.event for e in entries if isinstance(e.event, WorkerResult)]
        # One result, the notification's: not the surrogate's, not the stdout's.
        assert [r.lineage for r in results] == [worker], results
        out = json.loads(results[0].text)
        assert out["surrogate"] == [PARSE_ERROR, None]
        assert out["after_surrogate"] == {"lineage": worker}  # the connection lived
        assert out["huge_id"] == [INVALID_REQUEST, None]
        assert out["nan_id"] == [INVALID_REQUEST, None]
        assert out["no_method"] == [INVALID_REQUEST, 3]
        assert out["batch"] == [4, 5]  # the notification inside got no reply
        assert out["after_notification"] == 6  # nor did the one on its own
        ended = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        assert ended[worker].outcome == "exited", ended
        assert ended[worker].exit_code == 0, ended
        history = journal_history(charter.journal)
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
