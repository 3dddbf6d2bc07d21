"""The cell as the composition root builds it: :meth:`charter.app.Charter.cell` asks
the factory this module registers (:func:`charter.app.provide_cells`) for a cell with
its door on the root's services; :func:`run_cell` runs one."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from charter.app import CellOptions, CellRunner, Charter, provide_cells
from charter.control import steady_load
from charter.core import Budget
from charter.runner.cell import DEFAULT_CLAIM_S, Cell
from charter.runner.door import Door
from charter.runner.model import load_endpoint
from charter.sandbox import default_state_dir

__all__ = ["DEFAULT_SLOT_BUDGET", "build_cell", "cell_for", "run_cell", "steady_load"]

# The most any one worker's sandbox may get: each worker runs under its own lease and
# grant, narrowed from this (docs/cell.md, "Caps").
DEFAULT_SLOT_BUDGET = Budget.parse("tokens=0,wall=10m,cpu=10m,mem=512MiB,egress=100MB")


def build_cell(charter: Charter, options: CellOptions) -> Cell:
    """A cell (not opened yet) on ``charter``'s services, with its door: what
    :meth:`Charter.cell` hands out. The cell and its door decide through ``charter``
    (its one spawn pipeline, budgets and views)."""
    name = options.cell
    base = options.state_dir or default_state_dir()
    door = Door(
        base / f"door-{name}-{os.getpid()}.sock",
        model_path=base / f"model-{name}-{os.getpid()}.sock",
        endpoint=load_endpoint(charter.keys.home),
    )
    runner = Cell(
        charter,
        cell=name,
        budget=options.slot_budget or DEFAULT_SLOT_BUDGET,
        template=options.template,
        state_dir=base,
        key_broker=door,
        claim_s=DEFAULT_CLAIM_S if options.claim_s is None else options.claim_s,
        take_over=options.take_over,
        classes=options.classes,
    )
    door.cell = runner
    return runner


provide_cells(build_cell)


def cell_for(charter: Charter, **options: Any) -> Cell:
    """``charter.cell(**options)`` (:meth:`Charter.cell`), typed as the runner's
    :class:`Cell` for callers that reach into it (benchmarks, tools): a thin alias
    kept for code written before the composition root built cells."""
    built = charter.cell(**options)
    if not isinstance(built, Cell):
        raise TypeError(f"Charter.cell built a {type(built).__name__}, not a runner Cell")
    return built


def run_cell(cell: CellRunner, *, once: bool) -> None:
    """Open ``cell`` and follow the journal: with ``once``, until nothing of its is left
    to run; otherwise until stopped. The first SIGTERM (or ``charter cell drain``)
    drains: nothing more is started, and the cell stops once the workers it runs have
    finished. A second SIGTERM, or Ctrl-C, stops at once: closing kills what still runs
    (journaled first)."""
    stop = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.getsignal(s) for s in signals}

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM and not cell.draining:
            cell.draining = True
        else:
            stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            signal.signal(sig, on_signal)
    cell.open()
    try:
        cell.run(
            until=lambda: (
                stop.is_set() or (cell.draining and cell.running() == 0) or (once and cell.idle())
            )
        )
    finally:
        cell.close()
        if threading.current_thread() is threading.main_thread():
            for sig, handler in previous.items():
                signal.signal(sig, handler)
