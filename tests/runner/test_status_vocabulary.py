"""One worker-status vocabulary: ``charter cell status`` and the projections
(``charter tree``) name every live state the same way, from the same journal: a
coordinator waiting on its children is ``waiting`` in both, its running child
``running``, a worker holding a slot but not started ``admitted``, one behind the cap
``queued`` (real sandboxes, both backends)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import get_args

from charter.control import LIVE_STATUSES, WorkerStatus
from charter.projections import Projector
from charter.runner.events import WorkerStarted, WorkerWaiting
from charter.runner.status import cell_status
from tests.runner._support import fan_out, make_cell, running
from tests.runner.conftest import initialise
from tests.runner.programs import LINGER, python


def _both(charter: object, cell: str) -> tuple[dict[str, str], dict[str, str]]:
    journal = charter.journal  # type: ignore[attr-defined]
    status = {r.lineage: r.status for r in cell_status(journal, cell).workers}
    projector = Projector(journal, "vocab")
    try:
        projector.catch_up()
        tree = {n.lineage: n.worker for n in projector.tree().nodes if n.worker is not None}
    finally:
        projector.close()
    return status, tree


def _until(charter: object, check: object, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check(list(charter.journal.entries())):  # type: ignore[attr-defined, operator]
        assert time.monotonic() < deadline, "the workers did not get there in time"
        time.sleep(0.05)


def test_cell_status_and_the_projections_share_one_vocabulary(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    assert set(LIVE_STATUSES) < set(get_args(WorkerStatus))
    with initialise(journal_url, tmp_path / "home", processing=1, coordination=2) as charter:
        # Before any cell runs: one admitted, one queued behind the cap of 1.
        result = fan_out(charter, 2, python(LINGER, "1", "300"), fanout=10, depth=3)
        top, second = (str(c.lineage) for c in result.children)
        cell_name = charter.settings.cell
        status, tree = _both(charter, cell_name)
        assert status == tree == {top: "admitted", second: "queued"}
        cell = make_cell(charter, None, state_dir, door=True)
        cell.kill(second, "only its queued state was wanted")  # never starts
        with running(cell):
            child = f"{top}/sa-1"

            def child_runs(entries: list) -> bool:  # type: ignore[type-arg]
                waited = any(isinstance(e.event, WorkerWaiting) for e in entries)
                started = {e.event.lineage for e in entries if isinstance(e.event, WorkerStarted)}
                return waited and child in started

            # top waits on its child (its processing slot went to the child, which runs).
            _until(charter, child_runs)
            status, tree = _both(charter, cell_name)
            assert status[top] == tree[top] == "waiting", (status, tree)
            assert status[child] == tree[child] == "running", (status, tree)
            assert status[second] == tree[second] == "killed", (status, tree)
            cell.kill(top, "the test is done with it")
        status, tree = _both(charter, cell_name)
        assert tree == {top: "killed", child: "killed", second: "killed"}, tree
        assert status == tree  # cell status shows every worker not exited
