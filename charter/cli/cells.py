"""``charter cell configure``: journal a cell's slot caps (``charter slots`` shows them)."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from charter.app import CellSetup, Charter
from charter.cli._common import AsciiIntRange, Ctx, cell_classes, describe_invalid
from charter.cli._render import printable
from charter.core import Budget, StateError
from charter.core.text import shown
from charter.runner import run_cell  # registers how Charter.cell builds a cell
from charter.runner.status import cell_status, latest_incarnation

__all__ = ["cell_group"]

FC = TypeVar("FC", bound=Callable[..., Any])


@click.group("cell")
def cell_group() -> None:
    """Cells: the hosts that run workers, and their slot caps."""


def _cap(name: str, text: str) -> Callable[[FC], FC]:
    return click.option(f"--{name}", type=AsciiIntRange(0, 1_000_000), default=None, help=text)


@cell_group.command("run")
@click.option("--id", "cell", default=None, metavar="NAME", help="The cell (default: this host's).")
@click.option("--once", is_flag=True, help="Stop when nothing scheduled on the cell is left.")
@click.option(
    "--slot-budget",
    default="tokens=0,wall=10m,cpu=10m,mem=512MiB,egress=100MB",
    show_default=True,
    metavar="VECTOR",
    help="The most any worker's sandbox gets; each runs under its own lease and grant.",
)
@click.option(
    "--ignore-host-load",
    is_flag=True,
    help="Leave the load average out of the adaptive processing cap (a busy shared host).",
)
@click.option(
    "--claim",
    "claim_s",
    type=click.FloatRange(0.3, 3600),
    default=15.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the cell's claim holds; renewed every third of it while it runs.",
)
@click.option(
    "--take-over",
    is_flag=True,
    help="Fence the cell's running incarnation at once instead of waiting for its claim to lapse.",
)
@click.option(
    "--class",
    "classes",
    multiple=True,
    metavar="NAME",
    callback=cell_classes,
    help="A class of work this cell takes (repeatable; a short lowercase token): "
    "workers asking it (spawn --class) are placed only on live cells that have it.",
)
@click.pass_obj
def run(
    ctx: Ctx,
    cell: str | None,
    once: bool,
    slot_budget: str,
    ignore_host_load: bool,
    claim_s: float,
    take_over: bool,
    classes: tuple[str, ...],
) -> None:
    """Run a cell: follow the journal and run the workers scheduled on it (SIGTERM or
    Ctrl-C stops it; the workers still running are killed, journaled first). It holds
    the cell by a claim it renews: while another incarnation's claim holds, it waits
    for it to lapse (or fences it at once with --take-over). Its classes are journaled
    with its incarnation (`CellStarted.classes`)."""
    with Charter.open(ctx.db) as charter:
        runner = charter.cell(
            cell=cell,
            slot_budget=Budget.parse(slot_budget),
            ignore_host_load=ignore_host_load,
            claim_s=claim_s,
            take_over=take_over,
            classes=classes,
        )
        ctx.status(f"cell {runner.cell}: following the journal")
        run_cell(runner, once=once)
        ctx.emit(
            {"cell": runner.cell, "incarnation": runner.incarnation},
            f"cell {runner.cell} (incarnation {runner.incarnation}) stopped",
        )


@cell_group.command("drain")
@click.option("--id", "cell", default=None, metavar="NAME", help="The cell (default: this host's).")
@click.pass_obj
def drain(ctx: Ctx, cell: str | None) -> None:
    """Drain CELL's running incarnation on this host: it starts nothing more and stops
    once the workers it runs have finished (SIGTERM to its `cell run`; a second
    SIGTERM stops it at once, killing what runs)."""
    with Charter.open(ctx.db, read_only=True) as charter:
        name = cell or charter.settings.cell
        started = latest_incarnation(charter.journal, name)
    if started is None:
        raise StateError(f"cell {name!r} has never run on this journal")
    if started.host != socket.gethostname():
        raise StateError(
            f"cell {name!r} incarnation {started.incarnation} runs on {started.host}, not "
            "here: drain it there"
        )
    try:
        os.kill(started.pid, signal.SIGTERM)
    except ProcessLookupError:
        raise StateError(
            f"cell {name!r} incarnation {started.incarnation} (pid {started.pid}) is not running"
        ) from None
    ctx.emit(
        {"cell": name, "incarnation": started.incarnation, "pid": started.pid, "draining": True},
        f"cell {name} (incarnation {started.incarnation}, pid {started.pid}) is draining",
    )


@cell_group.command("status")
@click.option("--id", "cell", default=None, metavar="NAME", help="The cell (default: this host's).")
@click.pass_obj
def status(ctx: Ctx, cell: str | None) -> None:
    """A cell now: its caps, who holds its slots, its queue in order, and every worker
    that has not exited (queued, admitted, running, waiting, failed or killed)."""
    with Charter.open(ctx.db) as charter:
        report = cell_status(charter.journal, cell or charter.settings.cell)

    def say(line: str) -> None:
        click.echo(printable(line))  # the lineages and reasons may quote a worker

    def text() -> None:
        say(f"cell {report.cell} at position {report.position}")
        if report.incarnation:
            say(f"  incarnation {report.incarnation}: {report.state}")
        for name, cap in report.caps.items():
            held = report.holders.get(name, [])
            say(f"  {name}: {len(held)} of {cap}")
        say(f"  queued: {len(report.queued)}")
        if report.waits:
            say(f"  waiting because {report.waits}")
        for row in report.workers:
            why = f"  ({row.why})" if row.why and row.status == "admitted" else ""
            say(f"{shown(row.lineage)}  {row.status}  {row.burn}{why}")

    ctx.emit(report.to_json(), text)


@cell_group.command("configure")
@click.option("--id", "cell", default=None, metavar="NAME", help="The cell (default: this host's).")
@click.option("--cores", type=AsciiIntRange(1, 65_536), required=True, help="The cell's cores.")
@click.option(
    "--reserve",
    type=AsciiIntRange(0, 65_536),
    default=0,
    show_default=True,
    help="Cores held back as a failover reserve.",
)
@_cap("processing", "Processing slots (default: cores minus reserve).")
@_cap("coordination", "Coordination slots for waiting coordinators (default: 64 per core).")
@_cap("egress", "Egress slots (default: 4 per core).")
@_cap("inference", "Inference slots (default: 4 per core).")
@click.pass_obj
def configure(
    ctx: Ctx,
    cell: str | None,
    cores: int,
    reserve: int,
    processing: int | None,
    coordination: int | None,
    egress: int | None,
    inference: int | None,
) -> None:
    """Journal CELL's caps. A cap below the slots already held is refused."""
    try:
        setup = CellSetup(
            cores=cores,
            reserve=reserve,
            processing=processing,
            coordination=coordination,
            egress=egress,
            inference=inference,
        )
    except ValidationError as e:
        raise click.BadParameter(describe_invalid(e)) from e
    with ctx.open_charter() as charter:
        name = cell or charter.settings.cell
        charter.configure_cell(setup, name)
    caps = {str(k): v for k, v in setup.caps().items()}
    ctx.emit(
        {"cell": name, "cores": cores, "reserve": reserve, "caps": caps},
        f"cell {name}: " + ", ".join(f"{k} {v}" for k, v in caps.items()),
    )
