"""The door: workers fan out, wait and answer through it; identity comes from the
kernel; bad frames, floods and foreign requests get error replies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from charter.authority import SpawnRefused
from charter.control import WorkerScheduled
from charter.runner.client import Door, DoorError
from charter.runner.door import INVALID_PARAMS, INVALID_REQUEST, MAX_FRAME, PARSE_ERROR, REFUSED
from charter.runner.events import WorkerEnded, WorkerResult
from charter.sandbox import verify_signature
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import ATTACKER, BYSTANDER, CLASS_ASKER, COORDINATOR, python


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


def test_door_attacks_fail_and_do_not_harm_a_neighbour(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=4) as charter:
        sibling = "agent:estate/sa-2"
        workers = (python(ATTACKER, str(MAX_FRAME), sibling), python(BYSTANDER, "150"))
        result = fan_out(charter, 2, *workers, fanout=2, depth=2)
        attacker = str(result.children[0].lineage)
        keys = {str(c.lineage): bytes.fromhex(c.grant.subject_key) for c in result.children}
        cell = make_cell(charter, None, state_dir, door=True, max_requests=300)
        with running(cell):
            # The positive control for identity: a host process is no worker.
            with pytest.raises(DoorError) as refused:
                Door(str(cell.key_broker.path)).whoami()
            assert refused.value.code == REFUSED
            until_idle(cell)
        entries = list(charter.journal.entries())
        results = {
            e.event.lineage: e.event.text for e in entries if isinstance(e.event, WorkerResult)
        }
        out = json.loads(results[attacker])
        assert out["whoami"] == attacker
        assert out["intent_names_lineage"] == [INVALID_PARAMS, None]
        assert out["params_name_parent"] == [INVALID_PARAMS, None]
        assert out["worker_names_cell"] == [INVALID_PARAMS, None]
        assert out["envelope_names_caller"] == INVALID_REQUEST
        assert out["wait_on_sibling"] == [REFUSED, "not-a-child"]
        assert out["over_budget"][0] == REFUSED
        assert out["over_budget"][1] in {"insufficient-budget", "gate-negative"}
        assert out["over_fanout"] == [REFUSED, "fanout-exhausted"]
        assert out["valid_spawn"] == "ok"  # the same request, within the grant, works
        assert out["result_too_big"] == [REFUSED, "result-too-large"]
        assert out["malformed"] == PARSE_ERROR
        assert out["after_malformed"] == attacker  # the connection survives a bad line
        assert out["oversized"] == INVALID_REQUEST
        assert out["oversized_closed"] is True
        assert 3 <= out["connections_refused"] < 6
        assert out["flood_capped"] == 1
        signature = bytes.fromhex(out["signature"])
        assert verify_signature(keys[attacker], "demo/v1", b"hello", signature)
        assert not verify_signature(keys[sibling], "demo/v1", b"hello", signature)
        assert json.loads(results[sibling]) == [sibling]  # the neighbour was served
        ended = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        assert ended[attacker].exit_code == 0
        assert ended[sibling].exit_code == 0
        history = journal_history(charter.journal)
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []


def test_a_worker_may_ask_a_class_through_its_door_never_a_cell(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """A class is a requirement, not a placement: the door passes it to the fabric's
    rule (placed on a live cell that has it, refused when none does); naming a cell,
    alone or beside a class, is still refused before anything is decided."""
    with initialise(journal_url, tmp_path / "home", processing=2) as charter:
        result = fan_out(charter, 1, python(CLASS_ASKER, "gpu", "tpu"), fanout=5, depth=2)
        (asker,) = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, None, state_dir, door=True, classes=("gpu",))) as cell:
            until_idle(cell)
        entries = list(charter.journal.entries())
        results = {
            e.event.lineage: e.event.text for e in entries if isinstance(e.event, WorkerResult)
        }
        out = json.loads(results[asker])
        assert out["names_cell"] == [INVALID_PARAMS, None]
        assert out["names_cell_and_class"] == [INVALID_PARAMS, None]
        assert out["asks_bad_class"] == [INVALID_PARAMS, None]
        assert out["asks_missing_class"] == [REFUSED, "no-cell-of-class"]
        assert out["asks_class"][0] == "ok"  # the positive control: accepted and placed
        (child,) = out["asks_class"][1]
        scheduled = [
            e.event for e in entries
            if isinstance(e.event, WorkerScheduled) and e.event.lineage == child
        ]  # fmt: skip
        assert [(s.cell, s.cell_class) for s in scheduled] == [(charter.settings.cell, "gpu")]
        ended = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        assert ended[child].outcome == "exited"
        refused = [e.event for e in entries if isinstance(e.event, SpawnRefused)]
        assert [r.reason for r in refused] == ["no-cell-of-class"]  # journaled, once
        history = journal_history(charter.journal)
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
