"""``charter budgets``, ``charter tree``, ``charter slots`` and ``charter project``.

Every read command first brings the projection up to the journal head (incrementally,
exactly once), so an answer is never stale; ``--as-of POS`` answers for any position.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import click

from charter.app import Charter
from charter.cli._common import AsciiIntRange, Ctx
from charter.core import Budget
from charter.projections import BudgetReport, Projector, SlotsReport, TreeReport

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
    with Charter.open(ctx.db) as charter, charter.projector() as projector:
        projector.catch_up()
        yield projector


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    return datetime.fromtimestamp(value / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _amount(value: float, units: tuple[tuple[float, str], ...]) -> str:
    """``value`` in the largest unit it reaches, three significant digits at most (a
    value that rounds up to the next unit is shown in that unit: 1M, not 1e+03k)."""
    i = next((i for i, (size, _) in enumerate(units) if value >= size), None)
    if i is None:
        return f"{value:g}{units[-1][1]}"
    if i > 0 and float(f"{value / units[i][0]:.3g}") >= units[i - 1][0] / units[i][0]:
        i -= 1
    size, unit = units[i]
    if i == 0 and value / size >= 1000:  # beyond the largest unit: no exponent
        return f"{value / size:.0f}{unit}"
    return f"{float(f'{value / size:.3g}'):g}{unit}"


_TOKENS = ((1e6, "M"), (1e3, "k"), (1, ""))
_TIME = ((3_600_000, "h"), (60_000, "m"), (1_000, "s"), (1, "ms"))
_BYTES = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def _short(b: Budget) -> str:
    """A budget for people, in the units of CLI.md (``--json`` keeps exact integers)."""
    return (
        f"tokens {_amount(b.tokens, _TOKENS)}, wall {_amount(b.wall_ms, _TIME)}, "
        f"cpu {_amount(b.cpu_ms, _TIME)}, mem {_amount(b.mem_bytes, _BYTES)}, "
        f"egress {_amount(b.egress_bytes, _BYTES)}"
    )


def _render_budgets(report: BudgetReport) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"budgets as of position {report.as_of} ({_ms(report.at_ms)})")
    table.add_column("lineage", no_wrap=True)
    for column in ("status", "remaining", "spent (own)", "expires"):
        table.add_column(column)
    for line in report.ledgers:
        table.add_row(
            line.lineage,
            line.status + (" exhausted" if line.exhausted else ""),
            _short(line.remaining),
            _short(line.spent),
            _ms(line.expires_at_ms),
        )
    Console().print(table)


def _render_tree(report: TreeReport) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.tree import Tree

    top = Tree(f"lineage as of position {report.as_of}")
    branches: dict[str, Tree] = {}
    for node in report.nodes:  # sorted by path: a parent comes before its children
        # escaped: "[active]" would otherwise be read as rich markup and vanish
        # the lease's status, then (for a scheduled worker) the worker's own
        status = escape(f"[{node.status}]") + (f" {node.worker}" if node.worker else "")
        label = f"{node.lineage.rsplit('/', 1)[-1]}  {status} @{node.position}"
        if node.fanout:
            label += f" fan-out {node.fanout}"
        parent = branches.get(node.parent) if node.parent else None
        if parent is None:  # a root, or the top of the subtree asked for
            label = f"{node.lineage}  {status} @{node.position}"
        branches[node.lineage] = (parent or top).add(label)
    Console().print(top)


def _render_slots(report: SlotsReport) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"slots as of position {report.as_of}")
    for column in ("cell", "class", "occupancy", "cap", "holders", "queued (in order)"):
        table.add_column(column)

    def first(lineages: list[str]) -> str:
        more = f" (+{len(lineages) - 3})" if len(lineages) > 3 else ""
        return ", ".join(lineages[:3]) + more

    for cell in report.cells:
        for resource, info in cell.to_json()["slots"].items():
            table.add_row(
                cell.cell,
                resource,
                str(info["occupancy"]),
                str(info["cap"]),
                first(info["holders"]),
                first(info["queued"]),
            )
    Console().print(table)


@click.command()
@click.argument("lineage", required=False)
@_AS_OF
@click.pass_obj
def budgets(ctx: Ctx, lineage: str | None, as_of: int | None) -> None:
    """Budget ledgers (remaining, spent, status) of LINEAGE and below, or of all."""
    with _projector(ctx) as projector:
        report = projector.budgets(lineage, as_of)
    ctx.emit(report.to_json(), lambda: _render_budgets(report))


@click.command()
@click.argument("lineage", required=False)
@_AS_OF
@click.pass_obj
def tree(ctx: Ctx, lineage: str | None, as_of: int | None) -> None:
    """The lineage tree (derived from the paths) under LINEAGE, or every root."""
    with _projector(ctx) as projector:
        report = projector.tree(lineage, as_of)
    ctx.emit(report.to_json(), lambda: _render_tree(report))


@click.command()
@_AS_OF
@click.pass_obj
def slots(ctx: Ctx, as_of: int | None) -> None:
    """Slot occupancy per cell and resource class, and who queues for a slot."""
    with _projector(ctx) as projector:
        report = projector.slots(as_of)
    ctx.emit(report.to_json(), lambda: _render_slots(report))


@click.command()
@click.option("--rebuild", is_flag=True, help="Drop the projection rows and replay from zero.")
@click.option("--follow", is_flag=True, help="Keep projecting new entries until interrupted.")
@click.pass_obj
def project(ctx: Ctx, rebuild: bool, follow: bool) -> None:
    """Bring the projections up to the journal head (exactly once, resumable)."""
    with Charter.open(ctx.db) as charter, charter.projector() as projector:
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
