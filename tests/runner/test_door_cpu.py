"""The door's CPU serving a worker stays within CPU_MULTIPLE × the worker's own CPU +
CPU_BASE_S (docs/door.md): a sign flood and a result flood from real sandboxes are
refused with -32002 (``control-plane-cpu``) once past it, beside an honest worker that
signs and answers within it, never refused; a worker past it still gives its one result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from charter.runner.door import CPU_BASE_S, CPU_MULTIPLE, OVER_CPU, Door
from charter.runner.events import WorkerEnded, WorkerResult, WorkerStarted
from charter.sandbox import SandboxExited
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import PRELUDE, python

# Floods the door with argv[1] requests (sign of 64 KiB, or result of 60 KB) until it is
# refused, reconnects and is refused again; reports what it was told.
FLOOD = (
    PRELUDE
    + """
kind = sys.argv[1]
message = b"m" * 65_536
def ask(door):
    if kind == "sign":
        door.sign("flood/v1", message)
    else:
        door.result("r" * 60_000)
said, codes = [], []
door = charter_door.Door()
for _ in range(9_000):
    try:
        ask(door)
        said.append("ok")
    except charter_door.DoorError as e:
        said.append((e.data or {}).get("reason"))
        if e.code != -32602 and (e.data or {}).get("reason") == "control-plane-cpu":
            codes.append(e.code)
            break
again = charter_door.Door()  # a new connection is refused as well, unserved
try:
    ask(again)
    second = "ok"
except charter_door.DoorError as e:
    second = (e.data or {}).get("reason")
out = {"said": {r: said.count(r) for r in set(said)}, "codes": codes, "again": second}
sys.stderr.write(json.dumps(out, sort_keys=True))
sys.exit(3)
"""
)

# An honest worker: real work of its own, a few signatures, one answer.
HONEST = (
    PRELUDE
    + """
import hashlib
door = charter_door.Door()
digest = b""
for i in range(40):
    for _ in range(2_000):  # its own work: it hashes what it signs
        digest = hashlib.sha256(digest + b"x" * 4096).digest()
    door.sign("work/v1", b"m" * 65_536)
door.result("signed 40")
"""
)


def _ends(entries: list[Any]) -> dict[str, Any]:
    return {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}


def _run(charter: Any, state_dir: Path) -> tuple[Door, list[Any]]:
    """A cell with a door run until idle: its door, and the journal's entries."""
    cell = make_cell(charter, None, state_dir, door=True)
    door = cell.key_broker
    assert isinstance(door, Door)
    with running(cell):
        until_idle(cell, 240)
    return door, list(charter.journal.entries())


def _cpu_s(entries: list[Any], lineage: str) -> float:
    """The worker's own CPU, as its sandbox's cgroup counted it at its exit."""
    (sandbox_id,) = (
        e.event.sandbox_id
        for e in entries
        if isinstance(e.event, WorkerStarted) and e.event.lineage == lineage
    )
    exited = next(
        e.event
        for e in entries
        if isinstance(e.event, SandboxExited) and e.event.sandbox_id == sandbox_id
    )
    return float(exited.usage.cpu_ms) / 1000


@pytest.mark.sandbox
@pytest.mark.parametrize("kind", ["sign", "result"])
def test_a_flood_is_refused_past_its_cpu_allowance_and_an_honest_worker_is_not(
    journal_url: str, tmp_path: Path, state_dir: Path, kind: str
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=2) as charter:
        result = fan_out(charter, 2, python(FLOOD, kind), python(HONEST))
        flooder, honest = (str(c.lineage) for c in result.children)
        door, entries = _run(charter, state_dir)
        ends = _ends(entries)
        out = json.loads(ends[flooder].reason.removeprefix("stderr: "))
        # Refused by name and code, on its connection and on a new one.
        assert out["codes"] == [OVER_CPU]
        assert out["again"] == "control-plane-cpu"
        assert out["said"]["ok"] >= 1  # served until its allowance was spent
        # The door's CPU for it stayed within the allowance (plus the one frame served
        # past it, and the refused ones, each read but not parsed).
        served = door.served_history[flooder]
        own = _cpu_s(entries, flooder)
        assert served > CPU_BASE_S  # the flood did spend its base
        assert served <= CPU_BASE_S + CPU_MULTIPLE * own + 0.05, (served, own)
        # The positive control: served in full, never refused.
        assert ends[honest].outcome == "exited"
        assert ends[honest].exit_code == 0
        (answer,) = (
            e.event
            for e in entries
            if isinstance(e.event, WorkerResult) and e.event.lineage == honest
        )
        assert answer.text == "signed 40"
        assert door.served_history[honest] <= CPU_MULTIPLE * _cpu_s(entries, honest) + CPU_BASE_S


# Signs until refused past its allowance, then answers: its one result is served past
# the allowance; a second result and another signature are refused. Reports each.
OVER_THEN_RESULT = (
    PRELUDE
    + """
def reason(call):
    try:
        call(charter_door.Door())
        return "ok"
    except charter_door.DoorError as e:
        return [e.code, (e.data or {}).get("reason")]
door, signed = charter_door.Door(), 0
for _ in range(9_000):
    try:
        door.sign("flood/v1", b"m" * 65_536)
        signed += 1
    except charter_door.DoorError as e:
        if (e.data or {}).get("reason") == "control-plane-cpu":
            break
over = reason(lambda d: d.sign("flood/v1", b"m"))  # still over: refused
first = reason(lambda d: d.result("the answer " + "r" * 60_000))
second = reason(lambda d: d.result("another answer"))
after = reason(lambda d: d.sign("flood/v1", b"m"))
out = {"signed": signed, "over": over, "first": first, "second": second, "after": after}
sys.stderr.write(json.dumps(out, sort_keys=True))
sys.exit(3)
"""
)


@pytest.mark.sandbox
def test_a_worker_past_its_cpu_allowance_still_gives_its_one_result(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=2) as charter:
        result = fan_out(charter, 1, python(OVER_THEN_RESULT))
        (worker,) = (str(c.lineage) for c in result.children)
        door, entries = _run(charter, state_dir)
        out = json.loads(_ends(entries)[worker].reason.removeprefix("stderr: "))
        over = [OVER_CPU, "control-plane-cpu"]
        assert out["signed"] >= 1
        # The positive controls: past the allowance, other methods are refused, before
        # the result and after it.
        assert out["over"] == over
        assert out["after"] == over
        # Its first result is served; a second one is not (refused unparsed: the one
        # frame past the allowance a worker may send is spent).
        assert out["first"] == "ok"
        assert out["second"] == over
        (answer,) = (
            e.event
            for e in entries
            if isinstance(e.event, WorkerResult) and e.event.lineage == worker
        )
        assert answer.text == "the answer " + "r" * 60_000
        # The door's CPU for it: the allowance, plus the frames past it (the one parsed
        # and served, and the refused ones, read but not parsed).
        served, own = door.served_history[worker], _cpu_s(entries, worker)
        assert served <= CPU_BASE_S + CPU_MULTIPLE * own + 0.1, (served, own)
