"""``charter init``, ``charter journal verify`` and ``charter journal show``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
from pydantic import ValidationError

import charter.catalogue  # noqa: F401 - journal show decodes every event type
from charter.app import CellSetup, Charter
from charter.audit import ChainBrokenError, parse_head
from charter.audit.journal import audit_journal
from charter.cli._common import AsciiIntRange, Ctx
from charter.cli.agents import grant_options
from charter.control import Ceiling
from charter.ledger import Entry, Journal

__all__ = ["init", "journal"]


@click.command()
@click.option("--root", "root", default="root", show_default=True, help="The root agent's name.")
@click.option(
    "--cores",
    type=AsciiIntRange(1, 65_536),
    default=None,
    help="Cores of this host's cell (default: the host's).",
)
@click.option(
    "--reserve",
    type=AsciiIntRange(0, 65_536),
    default=0,
    show_default=True,
    help="Cores held back as the cell's failover reserve.",
)
@grant_options
@click.pass_obj
def init(ctx: Ctx, root: str, cores: int | None, reserve: int, ceiling: Ceiling) -> None:
    """Create the journal (once), the Charter home, the journal's signing key, the root
    agent (directory entry, custody key, ceiling grant, budget ledger) and this host's
    cell with its slot caps."""
    try:
        setup = CellSetup(cores=cores or CellSetup.for_host().cores, reserve=reserve)
    except ValidationError as e:
        raise click.BadParameter(str(e), param_hint="--cores/--reserve") from e
    charter, made = Charter.initialise(ctx.db, root=root, ceiling=ceiling, cell=setup)
    charter.close()
    ctx.status(f"initialised journal {made.location.display}")
    ctx.emit(
        made.to_json(),
        f"journal: {made.location.display}\nhome:    {made.home}\nroot:    {made.root.lineage}",
    )


@contextmanager
def _progress(ctx: Ctx) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr; None when quiet, --json, or stderr is not a terminal."""
    if ctx.quiet or ctx.as_json:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("verifying"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("verify", total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


@click.group()
def journal() -> None:
    """Inspect and verify the journal."""


@journal.command("verify")
@click.option("--from", "start", type=AsciiIntRange(min=1), help="First position to check.")
@click.option("--to", "stop", type=AsciiIntRange(min=1), help="Last position to check.")
@click.option(
    "--expect-head",
    metavar="POS:HASH",
    help="A head recorded earlier; catches a truncated tail or a rewritten history.",
)
@click.pass_obj
def verify(ctx: Ctx, start: int | None, stop: int | None, expect_head: str | None) -> None:
    """Recompute every hash from the stored bytes; exit 3 at the first bad entry."""
    expected = parse_head(expect_head) if expect_head else None
    with Journal.open(ctx.db) as j, _progress(ctx) as progress:
        report = audit_journal(j, start=start, stop=stop, expect_head=expected, progress=progress)
    if report.ok:
        head_text = (
            f"head {report.head.position}:{report.head.hash}" if report.head else "empty journal"
        )
        noun = "entry verifies" if report.checked == 1 else "entries verify"
        ctx.emit(report.to_json(), f"ok: {report.checked} {noun}; {head_text}")
        return
    if ctx.as_json:
        click.echo(json.dumps(report.to_json(), sort_keys=True))
        raise click.exceptions.Exit(3)
    raise ChainBrokenError(report)


def _matches_lineage(entry: Entry, lineage: str) -> bool:
    for value in entry.event.payload().values():
        if isinstance(value, str) and (value == lineage or value.startswith(lineage + "/")):
            return True
    return False


@journal.command("show")
@click.option("--from", "start", type=AsciiIntRange(min=1), help="First position.")
@click.option("--to", "stop", type=AsciiIntRange(min=1), help="Last position.")
@click.option("--type", "types", multiple=True, metavar="NAME", help="Only this event type.")
@click.option("--lineage", metavar="L", help="Only events about this lineage or below it.")
@click.option("--batch", metavar="ID", help="Only the entries one append wrote (its batch id).")
@click.pass_obj
def show(
    ctx: Ctx,
    start: int | None,
    stop: int | None,
    types: tuple[str, ...],
    lineage: str | None,
    batch: str | None,
) -> None:
    """One entry a line; with --json, JSON lines."""
    with Journal.open(ctx.db) as j:
        entries = j.batch_entries(batch) if batch else j.entries(start, stop, types)
        for entry in entries:
            if lineage and not _matches_lineage(entry, lineage):
                continue
            if ctx.as_json:
                click.echo(json.dumps(entry.to_json(), sort_keys=True))
            else:
                payload = json.dumps(entry.event.payload(), sort_keys=True, separators=(",", ":"))
                click.echo(
                    f"{entry.position:>8}  {entry.recorded_at:%Y-%m-%dT%H:%M:%S.%fZ}  "
                    f"{entry.type_name:<22} {entry.hash.hex()[:16]}  {payload}"
                )
