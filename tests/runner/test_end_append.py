"""A worker's end is one commit: its sandbox's exit, the usage charged, its lease
returned, its end, its sandbox's discard, its slot given back and the next queued worker
admitted. A lease that had ended already is refused (journaled, for the usage and the
release) and the rest still commits, once."""

from __future__ import annotations

import time
from pathlib import Path

from charter.budgets import BudgetRefused, LeaseReleased, SlotAdmitted, SlotReleased
from charter.control import WorkerSpec
from charter.ledger import Entry
from charter.runner.events import WorkerEnded, WorkerStarted
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise


def _settled(entries_of: object) -> None:
    history = journal_history(entries_of)
    assert check_history(history).problems == []
    assert check_workers(history).problems == []
    assert check_settled(history).problems == []


def _batch_of(entries: list[Entry], kind: type, lineage: str) -> list[Entry]:
    (one,) = (e for e in entries if isinstance(e.event, kind) and str(e.event.lineage) == lineage)  # type: ignore[attr-defined]
    return [e for e in entries if e.batch == one.batch]


def test_the_end_returns_the_lease_and_admits_the_next_in_one_commit(
    journal_url: str, tmp_path: Path, template: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        result = fan_out(charter, 2, WorkerSpec(argv=("/bin/true",)))
        first, second = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, template, state_dir)) as cell:
            until_idle(cell)
        entries = list(charter.journal.entries())
        batch = _batch_of(entries, WorkerEnded, first)
        kinds = [type(e.event).__name__ for e in batch]
        assert kinds == [
            "UsageRecorded",
            "LeaseReleased",
            "SandboxExited",
            "WorkerEnded",
            "SandboxDiscarded",
            "SlotReleased",
            "SlotAdmitted",
        ]
        assert str(batch[0].event.lineage) == first  # type: ignore[attr-defined]
        assert str(batch[1].event.lineage) == first  # type: ignore[attr-defined]
        assert str(batch[-1].event.lineage) == second  # type: ignore[attr-defined]
        for lineage in (first, second):  # each lease returned once, nothing refused
            released = [
                e for e in entries
                if isinstance(e.event, LeaseReleased) and str(e.event.lineage) == lineage
            ]  # fmt: skip
            assert len(released) == 1
        assert not any(isinstance(e.event, BudgetRefused) for e in entries)
        _settled(charter.journal)


def test_a_lease_that_ended_first_is_refused_and_the_end_still_commits_once(
    journal_url: str, tmp_path: Path, template: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=1) as charter:
        result = fan_out(charter, 2, WorkerSpec(argv=("/bin/sleep", "2")))
        first, second = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, template, state_dir)) as cell:
            deadline = time.monotonic() + 60
            while not any(
                isinstance(e.event, WorkerStarted) and str(e.event.lineage) == first
                for e in charter.journal.entries(types=("WorkerStarted",))
            ):
                assert time.monotonic() < deadline, "the first worker never started"
                time.sleep(0.02)
            charter.budgets().release(first)  # its lease ends while it runs
            until_idle(cell)
        entries = list(charter.journal.entries())
        refused = [
            e.event for e in entries
            if isinstance(e.event, BudgetRefused) and str(e.event.lineage) == first
        ]  # fmt: skip
        assert sorted(r.operation for r in refused) == ["release", "usage"]
        released = [
            e for e in entries
            if isinstance(e.event, LeaseReleased) and str(e.event.lineage) == first
        ]  # fmt: skip
        assert len(released) == 1  # the operator's, not a second one
        batch = _batch_of(entries, WorkerEnded, first)
        assert [type(e.event).__name__ for e in batch] == [
            "SandboxExited",
            "WorkerEnded",
            "SandboxDiscarded",
            "SlotReleased",
            "SlotAdmitted",
        ]
        assert any(
            isinstance(e.event, SlotAdmitted) and str(e.event.lineage) == second for e in batch
        )
        ends = [e for e in entries if isinstance(e.event, WorkerEnded)]
        assert sorted(str(e.event.lineage) for e in ends) == sorted([first, second])
        assert sum(isinstance(e.event, SlotReleased) for e in entries) == 2
        _settled(charter.journal)
