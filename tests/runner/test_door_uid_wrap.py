"""Issue 23 point 7 with real sandboxes: the uid pool wraps (narrowed here to one host
uid), so an innocent worker runs under the very uid a flooder just exhausted its door
requests under; it gets its own count, every request served. The frame-level cases
(connections, a kept connection) are in tests/runner/test_door_protocol.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from charter.runner.door import OVER_LIMIT
from charter.runner.events import WorkerResult
from charter.sandbox import SandboxLeased
from charter.sandbox import _host as sandbox_host
from tests.invariants import check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import PRELUDE, python

CAP = 40

ASK = (
    PRELUDE
    + """
door = charter_door.Door()
served, code = 0, None
for _ in range(int(sys.argv[1])):
    try:
        door.whoami()
        served += 1
    except charter_door.DoorError as e:
        code = e.code
        break
print(json.dumps({"served": served, "code": code}))
"""
)


@pytest.mark.sandbox
def test_a_worker_on_a_wrapped_uid_does_not_inherit_a_flooders_count(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox_host, "UID_RANGE", 1)  # every sandbox gets the one uid
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        result = fan_out(charter, 2, python(ASK, str(CAP * 3)), python(ASK, str(CAP)))
        flooder, innocent = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, None, state_dir, door=True, max_requests=CAP)) as cell:
            until_idle(cell, 180)
        entries = list(charter.journal.entries())
        leased = {e.event.lineage: e.event for e in entries if isinstance(e.event, SandboxLeased)}
        # The wrap happened: both ran as the same host uid, in different sandboxes.
        assert leased[flooder].host_uid == leased[innocent].host_uid
        assert leased[flooder].sandbox_id != leased[innocent].sandbox_id
        said = {
            e.event.lineage: json.loads(e.event.text)
            for e in entries
            if isinstance(e.event, WorkerResult)
        }
        # The attack: the flooder is capped, by the count of its own sandbox...
        assert said[flooder]["code"] == OVER_LIMIT
        assert said[flooder]["served"] <= CAP
        # ...and the innocent worker after it on that uid is served its whole own count.
        assert said[innocent] == {"served": CAP, "code": None}
        history = journal_history(charter.journal)
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
