"""A fenced incarnation's door stops answering before its sandboxes die (real
sandboxes, both backends). The first incarnation runs a worker that asks its door
again and again; a second ``charter cell run --take-over`` fences it. At the moment the
first one's kill begins (its freeze-then-kill, recorded as it is called) its door
serves no connection and accepts none for that worker's uid, while the worker's
processes are still there: the door stopped first. The control: before the fence the
door served that worker (a connection held, its requests answered)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from charter.control import CellSupersededError
from charter.runner import _driver
from charter.runner.events import WorkerEnded
from charter.sandbox import SandboxLeased
from tests.runner._support import ROOT_DIR, alive_under, fan_out, make_cell
from tests.runner._watching import spec_of, until
from tests.runner.conftest import initialise
from tests.runner.programs import PRELUDE, python

ASKER = (
    PRELUDE
    + """
import time
door = charter_door.Door()
while True:
    try:
        door.whoami()
    except Exception as e:  # the door hung up: it answers no more
        print("refused", type(e).__name__, flush=True)
        break
    time.sleep(0.01)
time.sleep(600)
"""
)


@pytest.mark.sandbox
def test_a_fenced_cells_door_stops_answering_before_its_sandboxes_die(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=1) as charter:
        (child,) = fan_out(charter, 1, python(ASKER)).children
        lineage = str(child.lineage)
        cell = make_cell(charter, None, state_dir, door=True)
        cell.claim_s = 1.5  # renewed every 0.5 s: the fence is seen at once
        door = cell.key_broker
        seen: list[dict[str, object]] = []
        real = _driver.freeze_then_kill

        def freeze_then_kill(controls, uids, freezing=None):  # type: ignore[no-untyped-def]
            if not seen and uid in uids:
                seen.append({
                    "connections": door.connections(),  # type: ignore[attr-defined]
                    "knows": cell.knows_uid(uid),
                    "alive": bool(alive_under({uid})),
                })  # fmt: skip
            return real(controls, uids, freezing)

        monkeypatch.setattr(_driver, "freeze_then_kill", freeze_then_kill)
        stop = threading.Event()
        failed: list[BaseException] = []

        def follow() -> None:
            try:
                cell.run(until=stop.is_set)
            except CellSupersededError:
                pass  # fenced: what the test is about
            except BaseException as e:
                failed.append(e)

        cell.open()
        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        try:
            uid = spec_of(cell, lineage).host_uid
            until("the worker asking its door", lambda: door.requests(uid) > 5, 60)  # type: ignore[attr-defined]
            assert door.connections() >= 1  # type: ignore[attr-defined]  # control
            assert cell.knows_uid(uid)
            env = {**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT_DIR),
                   "CHARTER_SANDBOX_STATE": str(state_dir)}  # fmt: skip
            second = subprocess.run(
                [sys.executable, "-m", "charter", "--db", journal_url, "--quiet", "cell",
                 "run", "--ignore-host-load", "--claim", "3", "--take-over", "--once"],
                env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert second.returncode == 0, second.stderr
            until("the first incarnation fenced", lambda: cell.fenced is not None, 30)
            until("its kill", lambda: bool(seen), 30)
        finally:
            stop.set()
            thread.join(timeout=30)
            cell.close()
        assert not failed, failed
        entries = list(charter.journal.entries())
    (first,) = seen
    assert first == {"connections": 0, "knows": False, "alive": True}
    ends = Counter(e.event.lineage for e in entries if isinstance(e.event, WorkerEnded))
    assert ends == {lineage: 1}  # ended once, by whichever incarnation
    uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}
    until("nothing left running", lambda: not alive_under(uids), 10)
