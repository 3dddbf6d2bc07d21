"""The cell runs what was committed, in order: schedule and lease before start, usage
and teardown after; a queue waits for slots and is never oversubscribed."""

from __future__ import annotations

from pathlib import Path

from charter.control import WorkerScheduled, WorkerSpec
from charter.runner.events import WorkerEnded, WorkerResult, WorkerStarted
from charter.sandbox import SandboxDiscarded, SandboxExited, SandboxLeased, SandboxStarted
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise


def test_workers_run_in_sandboxes_after_their_events_commit(
    journal_url: str, tmp_path: Path, template: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=2) as charter:
        spec = WorkerSpec(argv=("/bin/sh", "-c", 'echo "ran $0 as $(id -u)"'), inputs=("x",))
        result = fan_out(charter, 3, spec)
        assert len(result.admitted) == 2
        assert len(result.queued) == 1
        with running(make_cell(charter, template, state_dir)) as cell:
            until_idle(cell)
        entries = list(charter.journal.entries())
        pos: dict[tuple[str, str], int] = {}
        for e in entries:
            ev = e.event
            name = type(ev).__name__
            key = getattr(ev, "sandbox_id" if name.startswith("Sandbox") else "lineage", None)
            pos.setdefault((type(ev).__name__, str(key)), e.position)
        lineages = [str(c.lineage) for c in result.children]
        sandbox_of = {
            e.event.lineage: e.event.sandbox_id
            for e in entries
            if isinstance(e.event, WorkerStarted)
        }
        assert set(sandbox_of) == set(lineages)  # each started once
        assert sum(isinstance(e.event, WorkerStarted) for e in entries) == 3
        for lineage in lineages:
            sid = sandbox_of[lineage]
            start = pos[("SandboxStarted", sid)]
            assert pos[("WorkerScheduled", lineage)] < start
            assert pos[("SandboxLeased", sid)] < start
            assert start < pos[("SandboxExited", sid)] < pos[("SandboxDiscarded", sid)]
            assert pos[("WorkerEnded", lineage)] > start
        leased = [e.event for e in entries if isinstance(e.event, SandboxLeased)]
        assert {str(ev.lineage) for ev in leased} == set(lineages)
        scheduled = {
            e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerScheduled)
        }
        for ev in leased:
            assert ev.grant_digest == scheduled[str(ev.lineage)].grant_digest
        results = [e.event for e in entries if isinstance(e.event, WorkerResult)]
        assert sorted(r.text.split()[1] for r in results) == ["x"] * 3
        assert all(r.text.startswith("ran x as ") for r in results)
        ended = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
        assert [(x.outcome, x.exit_code) for x in ended] == [("exited", 0)] * 3
        assert sum(isinstance(e.event, SandboxStarted) for e in entries) == 3
        assert sum(isinstance(e.event, SandboxExited | SandboxDiscarded) for e in entries) == 6
        with charter.projector() as projector:
            projector.catch_up()
            slots = projector.slots()
        (cell_report,) = slots.cells
        history = journal_history(charter.journal)
        assert check_history(history).problems == []
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
        assert cell_report is not None
