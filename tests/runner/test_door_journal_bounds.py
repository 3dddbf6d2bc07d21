"""What a worker can make the journal hold through its door is bounded: one result
(64 KiB), never a flood of them; a wait names only children it spawned, so its
journaled size is bounded by its fan-out (real sandboxes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import charter.runner.door as door_module
from charter.runner.events import WorkerEnded, WorkerResult, WorkerWaiting
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import COST, PRELUDE, REASON, python

FLOOD = (
    PRELUDE
    + REASON
    + f"""
door = charter_door.Door()
me = door.whoami()["lineage"]
kids = door.spawn({{"width": 1, "objective": "echo one number back to the coordinator",
                   "estimated_cost": {{"tokens": 10_000, **{COST!r}}}}},
                  [{{"argv": ["/bin/echo", "1"]}}])["children"]
never = [me + "/sa-" + str(n) for n in range(2, 4002)]
out = {{"wait_on_unspawned": reason(lambda: door.wait(never, 1)),
        "wait_on_own": reason(lambda: door.wait(kids, 60)),
        "wait_on_own_4000_times": reason(lambda: door.wait(kids * 4000, 60))}}
results = [reason(lambda: door.result("x" * 60_000)) for _ in range(200)]
out["results"] = {{r: results.count(r) for r in set(results)}}
sys.stderr.write(json.dumps(out, sort_keys=True))
sys.exit(3)  # so the report is kept in the end's reason (its stderr's tail)
"""
)


@pytest.mark.sandbox
def test_a_worker_floods_results_and_waits_and_the_journal_holds_one_of_each(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The door's CPU rule binds first on a flood this cheap for the worker (under a
    # loaded host it did, at random, failing this test): it is tested on its own
    # (test_door_cpu.py); here only what reaches the journal is.
    monkeypatch.setattr(door_module, "CPU_BASE_S", 1e9)
    with initialise(journal_url, tmp_path / "home", processing=2) as charter:
        result = fan_out(charter, 1, python(FLOOD), fanout=5, depth=2)
        flooder = str(result.children[0].lineage)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell, 120)
        entries = list(charter.journal.entries())
        mine = [
            e for e in entries if isinstance(e.event, WorkerResult) and e.event.lineage == flooder
        ]
        assert len(mine) == 1  # the first result; 199 refused
        assert mine[0].event.size == 60_000  # type: ignore[attr-defined]
        waits = [e.event for e in entries if isinstance(e.event, WorkerWaiting)]
        # Only the waits on its own child, each naming it once, however often it was named.
        assert [len(w.children) for w in waits] == [1, 1]
        assert waits[0].children == waits[1].children
        # What the worker saw, from its stderr kept in its end's reason.
        end = next(
            e.event
            for e in entries
            if isinstance(e.event, WorkerEnded) and e.event.lineage == flooder
        )
        out = json.loads(end.reason.removeprefix("stderr: "))  # type: ignore[attr-defined]
        assert out == {
            "results": {"ok": 1, "result-given": 199},
            "wait_on_own": "ok",
            "wait_on_own_4000_times": "ok",
            "wait_on_unspawned": "not-a-child",
        }
