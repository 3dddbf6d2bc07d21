"""Helpers for cell tests: a cell on a journal, run until its workers are done."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from charter.app import Charter
from charter.authority import FixedPolicy, LineageRevokedError, MintedChild, SpawnIntent, Verdict
from charter.control import SpawnResult, WorkerSpec
from charter.core import Budget
from charter.runner.cell import Cell
from charter.runner.door import Door
from tests.runner.conftest import SLOT_BUDGET, steady

COST = Budget.parse("tokens=200k,wall=10m,cpu=10m,mem=1GiB,egress=0MB")
ROOT_DIR = Path(__file__).resolve().parents[2]


def cli_env(home: Path, state_dir: Path) -> dict[str, str]:
    """The environment of a ``python -m charter`` run by a test: this checkout, the
    test's home and sandbox state, no journal from the caller's environment."""
    return {
        **{k: v for k, v in os.environ.items() if k != "CHARTER_DB"},
        "CHARTER_HOME": str(home),
        "PYTHONPATH": str(ROOT_DIR),
        "CHARTER_SANDBOX_STATE": str(state_dir),
    }


def cell_process(url: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``charter cell run --once`` on the journal at ``url``, as an operator starts it
    (``env`` from :func:`cli_env`); its output dropped."""
    return subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", url, "--quiet", "cell", "run",
         "--once", "--ignore-host-load"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def fan_out(
    charter: Charter, width: int, *workers: WorkerSpec, cost: Budget = COST, **grant: object
) -> SpawnResult:
    intent = SpawnIntent.model_validate(
        {"width": width, "objective": "run the workers", "estimated_cost": cost, "grant": grant}
    )
    return charter.spawn(
        "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=tuple(workers)
    )


def make_cell(
    charter: Charter,
    template: Path | None,
    state_dir: Path,
    *,
    door: bool = False,
    max_requests: int = 10_000,
    budget: Budget = SLOT_BUDGET,
    classes: tuple[str, ...] = (),
) -> Cell:
    # Not KIND-DIGITS.sock: the sandbox janitor sweeps sockets named like a launcher's
    # (``egress-4242.sock``) whose pid is gone, and 8 hex digits are sometimes all digits.
    path = state_dir / f"door-test-{uuid.uuid4().hex[:8]}.sock"
    broker = Door(path, max_requests=max_requests) if door else None
    charter.host_load = steady
    cell = Cell(
        charter,
        cell=charter.settings.cell,
        template=template,
        budget=budget,
        state_dir=state_dir,
        key_broker=broker,
        classes=classes,
    )
    if broker is not None:
        broker.cell = cell
    return cell


@contextmanager
def running(cell: Cell) -> Iterator[Cell]:
    """The cell opened and following on a thread until the block ends."""
    stop = threading.Event()
    cell.open()
    thread = threading.Thread(target=cell.run, kwargs={"until": stop.is_set}, daemon=True)
    thread.start()
    try:
        yield cell
    finally:
        stop.set()
        thread.join(timeout=30)
        cell.close()


def until_idle(cell: Cell, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cell.idle():
        if time.monotonic() > deadline:
            raise TimeoutError("the cell's workers did not finish in time")
        time.sleep(0.05)


def alive_under(uids: set[int]) -> list[int]:
    """The pids of live processes (not zombies) running as any of ``uids``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
                    if state not in ("Z", "X"):
                        found.append(int(entry))
            except (FileNotFoundError, IndexError):
                continue
    return found


def mint_below_is_refused(charter: Charter, top: MintedChild) -> None:
    """A mint under ``top`` (a revoked fan-out child) is refused, journaled; the control,
    a mint beside it under the root, is made."""
    intent = SpawnIntent(
        width=1,
        objective="spawn below a revoked worker of the estate",
        estimated_cost=Budget.parse("tokens=10k,wall=1m,cpu=1m,mem=256MiB,egress=0"),
    )
    root = charter.spawn_service().durable_caller("estate")
    try:
        charter.spawn(root.child(top), intent, policy=FixedPolicy(Verdict.POSITIVE))
    except LineageRevokedError:
        pass
    else:
        raise AssertionError("a mint below a revoked lineage was made")
    charter.spawn("agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE))
