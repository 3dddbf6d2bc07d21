"""The main job: a real two-level fan-out over the Python standard library's sources.

In a fresh Charter home on the embedded SQLite journal: a coordinator shards the
sources and fans out reviewers that look for risky calls (``eval(``, ``pickle.loads``,
``shell=True``, ``os.system(``); a reviewer with a big shard fans out once more. Every
worker runs in its own sandbox under its own grant and lease, started by the cell only
after its events commit. The merged report, the usage totals and the verification of
the journal come back in a :class:`DemoOutcome`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from charter.app import CellSetup, Charter, Settings
from charter.audit import ChainReport, audit_chain
from charter.authority import SpawnIntent
from charter.control import Ceiling, ResourceView, WorkerSpec
from charter.core import Budget, KeyStore
from charter.runner import scan
from charter.runner._view import WorkersView
from charter.runner.errors import DemoFailedError
from charter.runner.host import run_cell
from charter.runner.status import Row, tree_rows

__all__ = ["DemoOutcome", "Row", "run_demo", "tree_rows"]

ROOT = "demo"
ROOT_BUDGET = Budget.parse("tokens=20M,wall=20h,cpu=20h,mem=64GiB,egress=0MB")
COORDINATOR_COST = Budget.parse("tokens=4M,wall=4h,cpu=4h,mem=16GiB,egress=0MB")
SLOT_BUDGET = Budget.parse("tokens=0,wall=10m,cpu=10m,mem=512MiB,egress=0MB")


@dataclass(frozen=True)
class DemoOutcome:
    home: Path
    journal: str
    report: dict[str, Any]
    totals: dict[str, int]
    verified: ChainReport
    rows: tuple[Row, ...]


def _initialise(home: Path, processing: int) -> Charter:
    home.mkdir(parents=True, exist_ok=True)
    charter, _ = Charter.initialise(
        f"sqlite:///{home / 'journal.db'}",
        root=ROOT,
        ceiling=Ceiling(budget=ROOT_BUDGET, depth=3, fanout=200),
        cell=CellSetup(cores=os.cpu_count() or 1, processing=processing, coordination=64),
        keys=KeyStore(home),
        settings=Settings(),
    )
    return charter


def run_demo(
    home: Path,
    *,
    shards: int = 6,
    processing: int | None = None,
    ignore_host_load: bool = False,
    on_tick: Callable[[list[Row]], None] | None = None,
    state_dir: Path | None = None,
) -> DemoOutcome:
    """Initialise ``home`` (it must be new), run the fan-out to its end, verify."""
    cores = os.cpu_count() or 1
    charter = _initialise(home, processing or max(2, cores))
    with charter:
        source = Path(scan.__file__).read_text()
        coordinator = WorkerSpec(argv=(scan.PY, "-I", "-c", source, "coordinate", str(shards)))
        intent = SpawnIntent.model_validate(
            {
                "width": 1,
                "objective": "review the Python standard library for risky calls",
                "estimated_cost": COORDINATOR_COST.model_dump(),
                "grant": {"fanout": 3 * shards, "depth": 2},
            }
        )
        result = charter.spawn(f"agent:{ROOT}", intent, workers=(coordinator,))
        top = str(result.children[0].lineage)
        cell = charter.cell(
            slot_budget=SLOT_BUDGET,
            ignore_host_load=ignore_host_load,
            state_dir=state_dir,
        )
        failure: list[BaseException] = []

        def drive() -> None:
            try:
                run_cell(cell, once=True)
            except BaseException as e:  # noqa: BLE001 - reported on the caller's thread
                failure.append(e)

        thread = threading.Thread(target=drive, name="demo-cell")
        thread.start()
        view, resources = WorkersView(), ResourceView()
        while True:
            alive = thread.is_alive()
            view.refresh(charter.journal)
            resources.refresh(charter.journal)
            rows = tree_rows(view, resources, cell.cell)
            if on_tick is not None:
                on_tick(rows)
            if not alive:
                break
            time.sleep(0.25)
        thread.join()
        if failure:
            raise failure[0]
        answer = view.workers[top]
        if answer.result is None or answer.ended is None or answer.ended.outcome != "exited":
            reason = answer.ended.reason if answer.ended else "it did not end"
            raise DemoFailedError(f"the demo's coordinator gave no report: {reason}")
        return DemoOutcome(
            home=home,
            journal=charter.journal.location.display,
            report=json.loads(answer.result.text),
            totals=_totals(charter),
            verified=audit_chain(charter.journal),
            rows=tuple(rows),
        )


def _totals(charter: Charter) -> dict[str, int]:
    totals = {"workers": 0, "cpu_ms": 0, "wall_ms": 0, "memory_peak_bytes": 0, "egress_bytes": 0}
    for entry in charter.journal.entries(types=("SandboxExited",)):
        usage = entry.event.usage  # type: ignore[attr-defined]
        totals["workers"] += 1
        totals["cpu_ms"] += usage.cpu_ms
        totals["wall_ms"] += usage.wall_ms
        totals["memory_peak_bytes"] = max(totals["memory_peak_bytes"], usage.memory_peak_bytes)
        totals["egress_bytes"] += usage.egress_bytes
    return totals
