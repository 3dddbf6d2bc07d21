"""Helpers for the supervision tests that run in a real cell: waiting on the journal,
and reaching into a live sandbox's workspace from the host."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from charter.ledger import Entry, Journal
from charter.runner import Cell
from charter.sandbox import SandboxSpec, sandbox_pid

VERDICTS = ("ThrottleVerdict", "PauseVerdict", "ResumeVerdict", "KillVerdict", "QuarantineVerdict")


def until(what: str, check: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.02)


def verdicts_on(journal: Journal, lineage: str) -> list[Entry]:
    return [e for e in journal.entries(types=VERDICTS) if e.event.lineage == lineage]  # type: ignore[attr-defined]


def ended(journal: Journal, lineages: set[str]) -> bool:
    ends = {e.event.lineage for e in journal.entries(types=("WorkerEnded",))}  # type: ignore[attr-defined]
    return lineages <= ends


def started(journal: Journal, lineage: str) -> bool:
    return any(
        e.event.lineage == lineage  # type: ignore[attr-defined]
        for e in journal.entries(types=("WorkerStarted",))
    )


def spec_of(cell: Cell, lineage: str) -> SandboxSpec:
    """The spec of ``lineage``'s sandbox, once the cell holds it."""
    until(
        f"{lineage}'s sandbox held",
        lambda: cell.driver is not None and cell.driver.slot(lineage) is not None,
    )
    assert cell.driver is not None
    slot = cell.driver.slot(lineage)
    assert slot is not None
    return slot.spec


def touch_in_workspace(spec: SandboxSpec, name: str) -> None:
    """Create ``/workspace/<name>`` in the live sandbox, from the host (a go-ahead the
    worker polls for)."""
    pid = sandbox_pid(spec)
    assert pid is not None, "the sandbox has no process left"
    Path(f"/proc/{pid}/root/workspace/{name}").write_bytes(b"")
