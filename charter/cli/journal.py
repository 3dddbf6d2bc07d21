"""``charter init``, ``charter journal verify`` and ``charter journal show``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from charter.cli._common import Ctx
from charter.cli.agents import grant_options
from charter.ledger.authority import Ceiling, register_root
from charter.ledger.errors import CharterError, StateError
from charter.ledger.home import KeyStore, charter_home
from charter.ledger.journal import Entry, Journal, JournalCreated, resolve_location
from charter.ledger.verify import ChainBrokenError, audit_journal, parse_head

__all__ = ["register"]

JOURNAL_KEY = "journal"


@click.command()
@click.option("--root", "root", default="root", show_default=True, help="The root agent's name.")
@grant_options
@click.pass_obj
def init(ctx: Ctx, root: str, ceiling: Ceiling) -> None:
    """Create the journal (once), the Charter home, the journal's signing key, and the
    root agent: its directory entry, custody key, ceiling grant and budget ledger."""
    location = resolve_location(ctx.db)
    keys = KeyStore(charter_home())
    # Refuse before writing anything if the target already holds something.
    Journal.refuse_existing(location)
    if keys.exists(JOURNAL_KEY):
        raise StateError(
            f"the Charter home {keys.home} already has a journal key; it belongs to an "
            "existing journal (use that one, or set CHARTER_HOME to a new directory)"
        )
    key = keys.create(JOURNAL_KEY)
    public = bytes(key.verify_key).hex()
    try:
        journal = Journal.create(location, journal_key=public)
    except CharterError:
        keys.remove(JOURNAL_KEY)  # nothing half-made: no key without its journal
        raise
    try:
        journal.append([JournalCreated(journal_key=public, created_at=journal.meta.created_at)])
        record = register_root(journal, keys, root, ceiling)
    except CharterError:
        journal.discard_new()  # nothing half-made: no journal without its root
        keys.remove(JOURNAL_KEY)
        raise
    with journal:
        head = journal.head()
        result = {
            "journal": location.display,
            "home": str(keys.home),
            "journal_key": public,
            "root": record.to_json(),
            "head": {"position": head[0], "hash": head[1].hex()} if head else None,
        }
    ctx.status(f"initialised journal {location.display}")
    ctx.emit(
        result,
        f"journal: {location.display}\nhome:    {keys.home}\nroot:    {record.lineage}",
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
@click.option("--from", "start", type=click.IntRange(min=1), help="First position to check.")
@click.option("--to", "stop", type=click.IntRange(min=1), help="Last position to check.")
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
@click.option("--from", "start", type=click.IntRange(min=1), help="First position.")
@click.option("--to", "stop", type=click.IntRange(min=1), help="Last position.")
@click.option("--type", "types", multiple=True, metavar="NAME", help="Only this event type.")
@click.option("--lineage", metavar="L", help="Only events about this lineage or below it.")
@click.pass_obj
def show(
    ctx: Ctx, start: int | None, stop: int | None, types: tuple[str, ...], lineage: str | None
) -> None:
    """One entry a line; with --json, JSON lines."""
    with Journal.open(ctx.db) as j:
        for entry in j.entries(start, stop, types):
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


def register(group: click.Group) -> None:
    group.add_command(init)
    group.add_command(journal)
