"""A cell that stops renewing its claim is gone by time, as any reader derives it: a
SIGKILLed `cell run` reads ``live`` while its last claim holds and ``gone`` once it
lapses (its started worker ``lost``), with nothing journaled in between; the next
incarnation then fails that worker (``lost``), returns its lease and slot (real
sandboxes, both backends; the independent fold after)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from charter.app import Charter
from charter.budgets import ResourceClass
from charter.control import ResourceView, WorkerSpec
from charter.core import KeyStore, now_ms
from charter.runner.events import CellStarted, WorkerEnded, WorkerKilled, WorkerStarted
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import cli_env, fan_out
from tests.runner.conftest import initialise

SLEEP = WorkerSpec(argv=("/bin/sleep", "120"))


def _status(url: str, home: Path, state_dir: Path) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, "--json", "cell", "status"],
        env=cli_env(home, state_dir), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def _projected(url: str, home: Path, state_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``charter tree`` and ``charter slots`` (the projections), as JSON."""
    out = []
    for command in ("tree", "slots"):
        r = subprocess.run(
            [sys.executable, "-m", "charter", "--db", url, "--json", command],
            env=cli_env(home, state_dir), capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out.append(json.loads(r.stdout))
    return out[0], out[1]


def _entries(url: str, home: Path) -> list[Any]:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        return list(charter.journal.entries())


@pytest.mark.sandbox
def test_a_sigkilled_cell_is_gone_once_its_claim_lapses_and_the_next_fails_its_worker(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=2) as charter:
        (lineage,) = (
            str(c.lineage)
            for c in fan_out(charter, 1, WorkerSpec(argv=("/bin/sleep", "120"))).children
        )
    claim_s = 3.0
    cell = subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", journal_url, "--quiet", "cell", "run",
         "--ignore-host-load", "--claim", str(claim_s)],
        env=cli_env(home, state_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not any(isinstance(e.event, WorkerStarted) for e in _entries(journal_url, home)):
            assert time.monotonic() < deadline, "the cell did not start its worker"
            time.sleep(0.1)
        running = _status(journal_url, home, state_dir)
        assert running["state"] == "live"
        tree, slots = _projected(journal_url, home, state_dir)
        assert {n["lineage"]: n["worker"] for n in tree["nodes"]}[lineage] == "running"
        assert slots["cells"][0]["state"] == "live"
        assert {w["lineage"]: w["status"] for w in running["workers"]} == {lineage: "running"}
    finally:
        cell.send_signal(signal.SIGKILL)
        cell.wait()
    head = len(_entries(journal_url, home))
    # Read before its last claim lapses: still live (nobody can tell a dead cell from a
    # slow one yet); after: gone, its worker lost. Nothing was journaled to say so.
    seen: set[str] = set()
    deadline = time.monotonic() + 3 * claim_s
    while "gone" not in seen:
        assert time.monotonic() < deadline, "the cell never read as gone"
        report = _status(journal_url, home, state_dir)
        lapsed = report["read_at_ms"] >= report["claim_until_ms"]
        assert report["state"] == ("gone" if lapsed else "live"), report
        workers = {w["lineage"]: w["status"] for w in report["workers"]}
        assert workers == {lineage: "lost" if lapsed else "running"}, report
        seen.add(report["state"])
        time.sleep(0.2)
    assert len(_entries(journal_url, home)) == head  # derived by time, not journaled
    # The projections say the same, from the claim and their answer's time.
    tree, slots = _projected(journal_url, home, state_dir)
    assert {n["lineage"]: n["worker"] for n in tree["nodes"]}[lineage] == "lost"
    (cell_slots,) = slots["cells"]
    assert cell_slots["state"] == "gone", cell_slots
    assert cell_slots["claim_until_ms"] == report["claim_until_ms"]
    assert report["claim_until_ms"] <= now_ms()
    # The next incarnation fails it, returns its lease and its slot.
    again = subprocess.run(
        [sys.executable, "-m", "charter", "--db", journal_url, "--quiet", "cell", "run",
         "--ignore-host-load", "--once", "--claim", str(claim_s)],
        env=cli_env(home, state_dir), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    entries = _entries(journal_url, home)
    assert [e.event.incarnation for e in entries if isinstance(e.event, CellStarted)] == [1, 2]
    (ended,) = (e for e in entries if isinstance(e.event, WorkerEnded))
    assert ended.event.outcome == "lost", ended.event
    kill = next(e for e in entries if isinstance(e.event, WorkerKilled))
    assert kill.position < ended.position  # journaled before anything was killed
    after = _status(journal_url, home, state_dir)
    assert after["state"] == "gone"  # incarnation 2 stopped: its claim ended with it
    assert {w["lineage"]: w["status"] for w in after["workers"]} == {lineage: "lost"}
    assert after["holders"] == {}
    with Charter.open(journal_url, keys=KeyStore(home)) as charter:
        view = ResourceView()
        view.refresh(charter.journal)
        # its lease came back (and may have left the book since: ended, all the same)
        assert view.book.retired(lineage) or not view.book.get(lineage).active(now_ms())
        state = view.cells.get(charter.settings.cell)
        assert not any(state.holders[r] for r in ResourceClass)
        history = journal_history(charter.journal)
    assert check_history(history).problems == []
    assert check_workers(history).problems == []
    assert check_settled(history).problems == []
