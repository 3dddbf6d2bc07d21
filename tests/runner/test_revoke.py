"""Revoking a 3-level subtree (`charter revoke`, from another process): no process of
it survives, nothing of it starts after the revocation's position, what each worker used
up to its kill is charged before its lease returns, and a mint under it is refused
(real sandboxes, both backends; the independent fold after)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from charter.authority import LineageRevoked
from charter.budgets import LeaseReleased, UsageRecorded
from charter.control import ResourceView
from charter.core import now_ms
from charter.runner._view import WorkerRecord
from charter.runner.events import WorkerEnded, WorkerStarted
from charter.sandbox import SandboxLeased
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import (
    alive_under,
    fan_out,
    make_cell,
    mint_below_is_refused,
    running,
    until_idle,
)
from tests.runner.conftest import initialise
from tests.runner.programs import LINGER, python

ROOT_DIR = Path(__file__).resolve().parents[2]


def _started(charter: object) -> list[str]:
    journal = charter.journal  # type: ignore[attr-defined]
    return [
        e.event.lineage
        for e in journal.entries(types=("WorkerStarted",))
        if isinstance(e.event, WorkerStarted)
    ]


def _outcomes(entries: list[Any]) -> dict[str, str]:
    """Each ended worker's outcome, by lineage."""
    return {e.event.lineage: e.event.outcome for e in entries if isinstance(e.event, WorkerEnded)}


def _until_started(charter: object, count: int) -> None:
    deadline = time.monotonic() + 90
    while len(_started(charter)) < count:
        assert time.monotonic() < deadline, "the subtree did not start"
        time.sleep(0.05)


@pytest.mark.sandbox
def test_revoking_a_subtree_kills_it_charges_it_and_refuses_its_mints(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=4, coordination=4) as charter:
        # top -> child -> grandchild (which sleeps); each waits on the one below.
        result = fan_out(charter, 1, python(LINGER, "2", "300"), fanout=10, depth=3)
        top = result.children[0]
        lineage = str(top.lineage)
        cell = make_cell(charter, None, state_dir, door=True)
        with running(cell):
            _until_started(charter, 3)
            began = time.monotonic()
            env = {**os.environ, "PYTHONPATH": str(ROOT_DIR), "CHARTER_HOME": str(home)}
            revoked = subprocess.run(
                [sys.executable, "-m", "charter", "--db", journal_url, "--json", "revoke",
                 lineage, "--reason", "the test revokes it"],
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert revoked.returncode == 0, revoked.stderr
            until_idle(cell, 30)
            took = time.monotonic() - began
        assert took < 10  # killed, not waited out (the leaf sleeps 300 s)
        entries = list(charter.journal.entries())
        at = next(e.position for e in entries if isinstance(e.event, LineageRevoked))
        subtree = [lineage, f"{lineage}/sa-1", f"{lineage}/sa-1/sa-1"]
        ends = {e.event.lineage: e for e in entries if isinstance(e.event, WorkerEnded)}
        assert {x: ends[x].event.outcome for x in subtree} == dict.fromkeys(subtree, "killed")  # type: ignore[attr-defined]
        starts = [e.position for e in entries if isinstance(e.event, WorkerStarted)]
        assert max(starts) < at  # nothing of it started after the revocation
        uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}
        assert alive_under(uids) == []  # no process of it survives
        # What each used up to its kill was charged, then its lease came back (its own
        # release, or an ancestor's: a release ends the subtree below it).
        released = {e.event.lineage: e.position for e in entries if e.type_name == "LeaseReleased"}  # type: ignore[attr-defined]
        for x in subtree:
            usage = [
                e.position
                for e in entries
                if e.type_name == "UsageRecorded" and e.event.lineage == x
            ]  # type: ignore[attr-defined]
            back = [released[a] for a in subtree if x.startswith(a) and a in released]
            assert usage, f"no usage charged for {x}"
            assert back, f"{x}'s lease did not come back"
            assert usage[0] < min(back)
        view = ResourceView()
        view.refresh(charter.journal)
        book = view.book  # an ended lease may have left the book: ended, all the same
        assert all(book.retired(x) or not book.get(x).active(now_ms()) for x in subtree)
        mint_below_is_refused(charter, top)  # refused, journaled; beside it, made
        history = journal_history(charter.journal)
        assert check_history(history).problems == []
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []


@pytest.mark.sandbox
def test_a_revoked_lineage_queued_for_a_slot_never_starts(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """Revoked while queued (the cell's one slot is busy): it is ended, never started;
    the worker beside it, not revoked, runs (the control)."""
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        from charter.control import WorkerSpec

        result = fan_out(charter, 2, WorkerSpec(argv=("/bin/sleep", "2")))
        first, second = (str(c.lineage) for c in result.children)
        charter.revoke(second, "revoked while queued")
        with running(make_cell(charter, None, state_dir)) as cell:
            until_idle(cell, 60)
        entries = list(charter.journal.entries())
        ends = _outcomes(entries)
        assert ends == {first: "exited", second: "killed"}
        assert _started(charter) == [first]
        assert charter.revoke(second) is None  # revoked already: nothing more journaled


@pytest.mark.sandbox
def test_a_parent_waits_for_its_killed_childs_end_not_only_its_sandbox(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """A killed child's sandbox is destroyed before its end (usage charged, lease
    returned) is journaled. Its parent, waiting for it, must not take the child's
    sandbox gone for its end: ended first, the parent's lease's return would end the
    child's, and the child's usage would be refused, never charged. The child's driver
    is held between its destroy and its end until its parent has looked (no sleeps):
    every look before its end finds it unended, and it is charged before its parent's
    lease returns."""
    with initialise(journal_url, tmp_path / "home", processing=4, coordination=4) as charter:
        result = fan_out(charter, 1, python(LINGER, "1", "300"), fanout=10, depth=2)
        top = str(result.children[0].lineage)
        leaf = f"{top}/sa-1"
        cell = make_cell(charter, None, state_dir, door=True)
        with running(cell):
            _until_started(charter, 2)
            driver = cell.driver
            assert driver is not None
            between = threading.Event()  # the leaf's sandbox destroyed, its end not journaled
            decided = threading.Event()  # its parent looked and waits, or ended
            looks: list[list[str]] = []
            destroy, unended, end = driver.destroy, cell._unended_descendants, cell._end

            def destroying(lineage: str) -> None:
                destroy(lineage)
                if lineage == leaf:
                    between.set()
                    assert decided.wait(30)

            def looking(lineage: str) -> list[str]:
                with cell._lock:  # the look, and whether the leaf's end is folded yet
                    found = unended(lineage)
                    live = cell.view.workers[leaf].live
                if lineage == top and between.is_set() and live:
                    looks.append(found)
                    if found:
                        decided.set()
                return found

            def ending(w: WorkerRecord, *args: Any, **kwargs: Any) -> None:
                end(w, *args, **kwargs)
                if w.lineage == top:
                    decided.set()

            driver.destroy = destroying  # type: ignore[method-assign]
            cell._unended_descendants = looking  # type: ignore[method-assign]
            cell._end = ending  # type: ignore[method-assign]
            charter.revoke(top, "the test revokes it")
            until_idle(cell, 30)
        entries = list(charter.journal.entries())
        ends = _outcomes(entries)
        assert ends == {top: "killed", leaf: "killed"}
        usage = [
            e.position
            for e in entries
            if isinstance(e.event, UsageRecorded) and e.event.lineage == leaf
        ]
        released = [
            e.position
            for e in entries
            if isinstance(e.event, LeaseReleased) and e.event.lineage == top
        ]
        assert usage, f"no usage charged for {leaf}"
        assert released
        assert usage[0] < released[0]
        assert looks  # it looked while the leaf was between its destroy and its end
        assert all(leaf in found for found in looks)
        history = journal_history(charter.journal)
        assert check_settled(history).problems == []
