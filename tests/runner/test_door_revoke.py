"""A worker may revoke its own descendants through the door, and nothing else: its
sibling, itself, its parent, its root and a name that is no lineage are each refused
(`not-a-descendant`, nothing journaled), beside the positive control, its own running
child, which is revoked and killed (real sandboxes, both backends; the fold after)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from charter.authority import LineageRevoked
from charter.runner.errors import RevokeRefusedError
from charter.runner.events import WorkerEnded, WorkerResult
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import COST, PRELUDE, PY, python

# argv[1]: its sibling's lineage. Spawns one sleeping child, tries to revoke what is not
# below it, then revokes the child (once it runs) and waits for its end.
REVOKER = (
    PRELUDE
    + f"""
import time
SLEEP = ["{PY}", "-I", "-c", "import time; time.sleep(600)"]
sibling = sys.argv[1]
door = charter_door.Door()
me = door.whoami()["lineage"]
def code(f):
    try:
        f()
        return "ok"
    except charter_door.DoorError as e:
        return [e.code, (e.data or {{}}).get("reason")]
(child,) = door.spawn({{"width": 1, "objective": "one sleeping child to revoke",
                       "estimated_cost": {{"tokens": 10_000, **{COST!r}}}}},
                      [{{"argv": SLEEP}}])["children"]
out = {{"child": child}}
for name, target in [("sibling", sibling), ("self", me), ("root", me.split("/")[0]),
                     ("nephew", sibling + "/sa-1"), ("garbage", "../" + child)]:
    out[name] = code(lambda: door.revoke(target, "an attack"))
time.sleep(2)  # the child may start meanwhile (queued or running, it is killed)
out["own child"] = code(lambda: door.revoke(child, "the positive control"))
out["wait"] = door.wait([child], 30)["children"][child]["status"]
door.result(json.dumps(out))
"""
)


@pytest.mark.sandbox
def test_a_worker_revokes_its_own_descendants_and_nothing_else(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=3, coordination=2) as charter:
        sibling = "agent:estate/sa-2"
        result = fan_out(
            charter, 2, python(REVOKER, sibling), python("import time; time.sleep(6)"),
            fanout=4, depth=2,
        )  # fmt: skip
        attacker, other = (str(c.lineage) for c in result.children)
        assert other == sibling
        began = time.monotonic()
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell, 90)
        took = time.monotonic() - began
        entries = list(charter.journal.entries())
        (answer,) = [e.event for e in entries if isinstance(e.event, WorkerResult)]
        out = json.loads(answer.text)
        refused = [-32000, RevokeRefusedError.reason]
        for name in ("sibling", "self", "root", "nephew", "garbage"):
            assert out[name] == refused, name
        assert out["own child"] == "ok"  # the positive control
        assert out["wait"] == "killed"
        child = out["child"]
        revoked = [str(e.event.lineage) for e in entries if isinstance(e.event, LineageRevoked)]
        assert revoked == [child]  # the refused ones journaled nothing
        ends = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        assert ends[child].outcome == "killed"
        assert ends[sibling].outcome == "exited"  # the sibling it attacked ran on
        assert ends[attacker].outcome == "exited"
        assert took < 60  # the child's 600 s sleep was cut short
        history = journal_history(charter.journal)
        assert check_history(history).problems == []
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
