"""``charter budgets``, ``charter tree``, ``charter slots`` and ``charter project``.

Every read command first brings the projection up to the journal head (incrementally,
exactly once), so an answer is never stale; ``--as-of POS`` answers for any position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import NoReturn

import click
from rich.console import Console

from charter.cli._common import AsciiIntRange, Ctx
from charter.cli._render import render_budgets, render_slots, render_tree, select
from charter.projections import Projector

__all__ = ["budgets", "project", "slots", "tree"]

_AS_OF = click.option(
    "--as-of",
    "as_of",
    type=AsciiIntRange(min=0),
    metavar="POS",
    help="Answer as of this journal position (default: the head).",
)


@contextmanager
def _projector(ctx: Ctx) -> Iterator[Projector]:
    with ctx.open_charter(reader=True) as charter, charter.projector() as projector:
        projector.catch_up()
        yield projector


def _unknown(lineage: str, as_of: int) -> NoReturn:
    """An empty answer for a lineage the journal never named is a typo, not a fact."""
    raise click.BadParameter(
        f"no lineage {lineage} in the journal as of position {as_of} "
        "(`charter tree` lists them all)",
        param_hint="LINEAGE",
    )


_DEFAULT_LIMIT = 100  # rows for people; --json gives every row unless --limit says


def _filters(statuses: tuple[str, ...]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        for option in reversed(
            (
                click.argument("lineage", required=False),
                click.option(
                    "--lineage",
                    "lineage_option",
                    metavar="L",
                    help="Only L and the lineages below it (the same as the argument).",
                ),
                click.option(
                    "--status",
                    "statuses",
                    multiple=True,
                    type=click.Choice(statuses),
                    help="Only rows of this status (repeatable).",
                ),
                click.option(
                    "--limit",
                    type=AsciiIntRange(min=0),
                    default=None,
                    help=f"At most this many rows; 0 for all (default: {_DEFAULT_LIMIT} "
                    "for people, all with --json).",
                ),
                _AS_OF,
            )
        ):
            command = option(command)
        return command

    return decorate


def _scope(ctx: Ctx, lineage: str | None, lineage_option: str | None) -> str | None:
    if lineage and lineage_option and lineage != lineage_option:
        raise click.UsageError(f"two lineages given: {lineage} and --lineage {lineage_option}")
    return lineage or lineage_option


def _limit(ctx: Ctx, limit: int | None) -> int | None:
    if limit == 0 or (limit is None and ctx.as_json):
        return None
    return _DEFAULT_LIMIT if limit is None else limit


def _left_out(ctx: Ctx, count: int, noun: str) -> None:
    """Part of the rendering for people (a JSON document is exactly what was asked)."""
    if count and not ctx.as_json:
        click.echo(f"… {count} more {noun} not shown (--limit 0 shows all)")


@click.command()
@_filters(("active", "released", "expired"))
@click.pass_obj
def budgets(
    ctx: Ctx,
    lineage: str | None,
    lineage_option: str | None,
    statuses: tuple[str, ...],
    limit: int | None,
    as_of: int | None,
) -> None:
    """What each budget ledger (of LINEAGE and below, or of all) has left, and when its
    lease ends; --json adds the allocation, spending and outstanding leases, exact."""
    lineage = _scope(ctx, lineage, lineage_option)
    with _projector(ctx) as projector:
        report = projector.budgets(lineage, as_of)
    if lineage and not report.ledgers:
        _unknown(lineage, report.as_of)
    rows, left = select(
        report.ledgers,
        lambda line: line.lineage,
        lambda line: line.status,
        statuses=statuses,
        limit=_limit(ctx, limit),
    )
    report = replace(report, ledgers=tuple(rows))
    ctx.emit(report.to_json(), lambda: render_budgets(report, Console()))
    _left_out(ctx, left, "ledgers")


@click.command()
@_filters(("active", "released", "expired", "no-ledger"))
@click.pass_obj
def tree(
    ctx: Ctx,
    lineage: str | None,
    lineage_option: str | None,
    statuses: tuple[str, ...],
    limit: int | None,
    as_of: int | None,
) -> None:
    """The lineage tree (derived from the paths) under LINEAGE, or every root."""
    lineage = _scope(ctx, lineage, lineage_option)
    with _projector(ctx) as projector:
        report = projector.tree(lineage, as_of)
    if lineage and not report.nodes:
        _unknown(lineage, report.as_of)
    rows, left = select(
        report.nodes,
        lambda node: node.lineage,
        lambda node: node.status,
        statuses=statuses,
        limit=_limit(ctx, limit),
    )
    report = replace(report, nodes=tuple(rows))
    ctx.emit(report.to_json(), lambda: render_tree(report, Console()))
    _left_out(ctx, left, "lineages")


@click.command()
@_AS_OF
@click.pass_obj
def slots(ctx: Ctx, as_of: int | None) -> None:
    """Slot occupancy per cell and resource class, and who queues for a slot."""
    with _projector(ctx) as projector:
        report = projector.slots(as_of)
    ctx.emit(report.to_json(), lambda: render_slots(report, Console()))


@click.command()
@click.option("--rebuild", is_flag=True, help="Drop the projection rows and replay from zero.")
@click.option("--follow", is_flag=True, help="Keep projecting new entries until interrupted.")
@click.pass_obj
def project(ctx: Ctx, rebuild: bool, follow: bool) -> None:
    """Bring the projections up to the journal head (exactly once, resumable)."""
    with ctx.open_charter() as charter, charter.projector() as projector:
        before = projector.position()
        position = projector.rebuild() if rebuild else projector.catch_up()
        ctx.status(f"projected to position {position}")
        if follow:
            ctx.status("following the journal; Ctrl-C to stop")
            try:
                position = projector.follow(
                    on_step=lambda p: ctx.status(f"projected to position {p}")
                )
            except KeyboardInterrupt:
                position = projector.position()
        counts = projector.counts()
    data = {
        "position": position,
        "previous": before,
        "rebuilt": rebuild,
        "entries": sum(counts.values()),
        "counts": counts,
    }
    ctx.emit(data, f"projected to position {position} ({data['entries']} entries)")
