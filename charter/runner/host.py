"""A cell for an open :class:`~charter.app.Charter`, with its door: the composition the
CLI, the demo and the tests use."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from charter.app import Charter
from charter.control import steady_load
from charter.core import Budget
from charter.runner.cell import DEFAULT_CLAIM_S, Cell
from charter.runner.door import Door
from charter.runner.model import load_endpoint
from charter.sandbox import default_state_dir

__all__ = ["DEFAULT_SLOT_BUDGET", "cell_for", "run_cell", "steady_load"]

# The most any one worker's sandbox may get: each worker runs under its own lease and
# grant, narrowed from this (docs/cell.md, "Caps").
DEFAULT_SLOT_BUDGET = Budget.parse("tokens=0,wall=10m,cpu=10m,mem=512MiB,egress=100MB")


def cell_for(
    charter: Charter,
    *,
    cell: str | None = None,
    slot_budget: Budget = DEFAULT_SLOT_BUDGET,
    state_dir: Path | None = None,
    template: Path | None = None,
    ignore_host_load: bool = False,
    claim_s: float = DEFAULT_CLAIM_S,
    take_over: bool = False,
) -> Cell:
    """A cell (not opened yet) on ``charter``'s services, with its door. The cell and
    its door decide through ``charter`` (its one spawn pipeline, budgets and views);
    ``ignore_host_load`` makes every decision of this process ignore the load average
    (:func:`~charter.control.steady_load`). The cell holds its id by a claim of
    ``claim_s`` seconds it renews; ``take_over`` fences a live incarnation at once
    instead of waiting for its claim to lapse."""
    name = cell or charter.settings.cell
    base = state_dir or default_state_dir()
    if ignore_host_load:
        charter.host_load = steady_load
    door = Door(
        base / f"door-{name}-{os.getpid()}.sock",
        model_path=base / f"model-{name}-{os.getpid()}.sock",
        endpoint=load_endpoint(charter.keys.home),
    )
    runner = Cell(
        charter,
        cell=name,
        budget=slot_budget,
        template=template,
        state_dir=base,
        key_broker=door,
        claim_s=claim_s,
        take_over=take_over,
    )
    door.cell = runner
    return runner


def run_cell(cell: Cell, *, once: bool) -> None:
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
