"""``charter init``, ``charter journal verify`` and ``charter journal show``."""

from __future__ import annotations

import dataclasses
import json

import click
from pydantic import ValidationError

import charter.catalogue  # noqa: F401 - journal show decodes every event type
from charter.app import CellSetup, Charter
from charter.audit import ChainBrokenError, parse_head
from charter.audit.export import mentions
from charter.audit.journal import audit_journal
from charter.cli._common import AsciiIntRange, Ctx, describe_invalid
from charter.cli._render import brief_payload, decode_nested, printable, progress_bar
from charter.cli.agents import grant_options
from charter.cli.audit import extends_checkpoint
from charter.control import Ceiling

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
        raise click.BadParameter(describe_invalid(e), param_hint="--cores/--reserve") from e
    ctx.refuse_missing_journal()
    charter, made = Charter.initialise(ctx.db, root=root, ceiling=ceiling, cell=setup)
    charter.close()
    ctx.status(f"initialised journal {made.location.display}")
    ctx.emit(
        made.to_json(),
        f"journal: {made.location.display}\nhome:    {made.home}\nroot:    {made.root.lineage}",
    )


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
@click.option(
    "--checkpoint",
    metavar="FILE",
    help="A signed checkpoint saved earlier: also prove the journal extends it (a cut "
    "tail or a consistently re-hashed history exits 3).",
)
@click.option(
    "--journal-key",
    "vkey",
    metavar="KEY",
    help="The checkpoint's verifier key (default: the journal's).",
)
@click.pass_obj
def verify(
    ctx: Ctx,
    start: int | None,
    stop: int | None,
    expect_head: str | None,
    checkpoint: str | None,
    vkey: str | None,
) -> None:
    """Recompute every hash from the stored bytes; exit 3 at the first bad entry."""
    expected = parse_head(expect_head) if expect_head else None
    with ctx.open_journal() as j, progress_bar(ctx.quiet or ctx.as_json, "verifying") as progress:
        report = audit_journal(j, start=start, stop=stop, expect_head=expected, progress=progress)
    payload = report.to_json()
    also_checkpoint = ""
    if report.ok and checkpoint is not None:
        extension = extends_checkpoint(ctx, checkpoint, vkey)  # raises (exit 3) if not
        payload["checkpoint"] = dataclasses.asdict(extension)
        also_checkpoint = (
            f", and it extends the checkpoint of {extension.checkpoint_size} entries in "
            f"{checkpoint}"
        )
    if report.ok:
        head_text = (
            f"head {report.head.position}:{report.head.hash}" if report.head else "empty journal"
        )
        noun = "entry" if report.checked == 1 else "entries"
        also = f", and it holds the expected head {expect_head}" if expected else ""
        also += also_checkpoint
        ctx.emit(
            payload,
            f"ok: the hash chain of {report.checked} {noun} verifies (each hash recomputed "
            f"from the stored bytes, each entry linked to the one before){also}; "
            f"{head_text}\nnot checked by this command: grant signatures, and whether "
            "what the entries say is consistent (budgets, attenuation)",
        )
        return
    if ctx.as_json:
        click.echo(json.dumps(report.to_json(), sort_keys=True))
        raise click.exceptions.Exit(3)
    raise ChainBrokenError(report)


@journal.command("show")
@click.option("--from", "start", type=AsciiIntRange(min=1), help="First position.")
@click.option("--to", "stop", type=AsciiIntRange(min=1), help="Last position.")
@click.option("--type", "types", multiple=True, metavar="NAME", help="Only this event type.")
@click.option("--lineage", metavar="L", help="Only events about this lineage or below it.")
@click.option("--batch", metavar="ID", help="Only the entries one append wrote (its batch id).")
@click.option("--limit", type=AsciiIntRange(min=1), help="At most this many entries.")
@click.option("--full", is_flag=True, help="Whole payloads (nested JSON decoded), not shortened.")
@click.pass_obj
def show(
    ctx: Ctx,
    start: int | None,
    stop: int | None,
    types: tuple[str, ...],
    lineage: str | None,
    batch: str | None,
    limit: int | None,
    full: bool,
) -> None:
    """One entry a line, its payload shortened (--full for all of it); with --json,
    JSON lines of the stored payloads."""
    shown = 0
    with ctx.open_journal() as j:
        entries = j.batch_entries(batch) if batch else j.entries(start, stop, types)
        for entry in entries:
            if limit is not None and shown >= limit:
                break
            if lineage and not mentions(entry.event.payload(), lineage):
                continue
            shown += 1
            if ctx.as_json:
                click.echo(json.dumps(entry.to_json(), sort_keys=True))
                continue
            payload = entry.event.payload()
            text = (
                json.dumps(decode_nested(payload), sort_keys=True, separators=(",", ":"))
                if full
                else brief_payload(payload)
            )
            # the whole line through printable: a payload is worker-controlled text
            click.echo(
                printable(
                    f"{entry.position:>6} {entry.recorded_at:%Y-%m-%d %H:%M:%S}Z "
                    f"{entry.type_name} {text}"
                )
            )
