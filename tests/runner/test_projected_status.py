"""``charter tree`` shows each worker's status and ``charter slots`` the queue, from the
projections: at every journal position they equal an independent fold of the worker and
admission events (rebuilt and incremental alike)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from charter.budgets import Cells, ResourceClass, SlotAdmitted
from charter.control import WorkerScheduled
from charter.ledger import Journal
from charter.projections import Projector
from charter.runner.events import WorkerEnded, WorkerStarted, WorkerWaiting
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import python

# Each worker exits with the code it is given; one is killed while it still waits.
EXIT_WITH = "import sys; sys.exit(int(sys.argv[1]))"


def _expected(journal: Journal) -> dict[int, tuple[dict[str, str], dict[str, list[str]]]]:
    """Per position: each worker's status and each cell's processing queue, folded here
    from the events as the design describes them (not by the projection's code)."""
    cells = Cells()
    status: dict[str, str] = {}
    out: dict[int, tuple[dict[str, str], dict[str, list[str]]]] = {}
    for entry in journal.entries():
        event = entry.event
        cells.apply(event)
        match event:
            case WorkerScheduled():
                status[event.lineage] = "admitted"
            case WorkerWaiting():
                status[event.lineage] = "waiting"
            case SlotAdmitted(resource=ResourceClass.PROCESSING) if (
                status.get(event.lineage) == "waiting"
            ):
                status[event.lineage] = "running"
            case WorkerStarted():
                status[event.lineage] = "running"
            case WorkerEnded():
                status[event.lineage] = event.outcome
            case _:
                pass
        queues = {
            name: list(state.queued[ResourceClass.PROCESSING])
            for name, state in cells.cells().items()
        }
        waiting = {lin for q in queues.values() for lin in q}
        shown = {
            lin: ("queued" if s == "admitted" and lin in waiting else s)
            for lin, s in status.items()
        }
        out[entry.position] = (shown, {c: q for c, q in queues.items() if q})
    return out


def _answers(projector: Projector, position: int) -> tuple[dict[str, str], dict[str, list[str]]]:
    tree = projector.tree(as_of=position)
    statuses = {n.lineage: n.worker for n in tree.nodes if n.worker is not None}
    queues = {
        c.cell: list(c.queued[ResourceClass.PROCESSING.value])
        for c in projector.slots(as_of=position).cells
        if c.queued.get(ResourceClass.PROCESSING.value)
    }
    return statuses, queues


def _cli(url: str, home: Path, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if k != "CHARTER_DB"}
    env["CHARTER_HOME"] = str(home)
    r = subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, "--json", *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_tree_and_slots_show_worker_status_and_the_queue(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=1) as charter:
        workers = [python(EXIT_WITH, str(code)) for code in (0, 3, 0)]
        result = fan_out(charter, 3, *workers)
        lineages = [str(c.lineage) for c in result.children]
        # Before any cell runs: one admitted, two queued behind it, in order.
        tree = _cli(journal_url, home, "tree")
        shown = {n["lineage"]: n["worker"] for n in tree["nodes"]}
        assert [shown[lin] for lin in lineages] == ["admitted", "queued", "queued"]
        assert shown["agent:estate"] is None  # a durable agent is no scheduled worker
        slots = _cli(journal_url, home, "slots")
        (cell,) = slots["cells"]
        assert cell["slots"]["processing"]["queued"] == lineages[1:]
        assert cell["slots"]["processing"]["holders"] == lineages[:1]
        # The last queued one is killed before it ever starts.
        cell_runner = make_cell(charter, None, state_dir)
        cell_runner.kill(lineages[2], "not wanted any more")
        with running(cell_runner) as c:
            until_idle(c)
        tree = _cli(journal_url, home, "tree")
        shown = {n["lineage"]: n["worker"] for n in tree["nodes"]}
        assert [shown[lin] for lin in lineages] == ["exited", "exited", "killed"]
        slots = _cli(journal_url, home, "slots")
        assert slots["cells"][0]["slots"]["processing"]["queued"] == []

        want = _expected(charter.journal)
        incremental = Projector(charter.journal, "inc")
        stepped = Projector(charter.journal, "step")
        rebuilt = Projector(charter.journal, "reb")
        try:
            incremental.catch_up()
            rebuilt.rebuild()
            seen_running = seen_queued = False
            for position, expected in want.items():
                assert stepped.catch_up(stop=position) == position
                for projector in (incremental, stepped, rebuilt):
                    assert _answers(projector, position) == expected, (projector, position)
                seen_running |= "running" in expected[0].values()
                seen_queued |= bool(expected[1])
            # The history passed through every state the test claims to check.
            assert seen_running
            assert seen_queued
            # A projection made before the worker and queue tables existed is replayed
            # once when opened, so its answers are whole, not only from then on.
            head = max(want)
            with incremental.store.write() as cur:
                for table in ("workers", "queue", "claims", "samples"):
                    cur.execute(f"DROP TABLE inc_{table}")
            incremental.close()
            incremental = Projector(charter.journal, "inc")
            assert incremental.position() == head
            assert _answers(incremental, head) == want[head]
            assert _answers(incremental, head)[0]  # control: the statuses are there
        finally:
            for projector in (incremental, stepped, rebuilt):
                projector.close()
