"""``charter lease usage|release|renew``: the operator's (and, until the runner records
them itself, the tests') way to charge and end leases."""

from __future__ import annotations

import click

from charter.cli._common import AsciiIntRange, Ctx
from charter.core import Budget
from charter.core.budget import INT64_MAX

__all__ = ["lease_group"]


@click.group("lease")
def lease_group() -> None:
    """Record usage against a worker's lease, release it, or renew it."""


@lease_group.command("usage")
@click.argument("lineage")
@click.option("--amount", required=True, metavar="VECTOR", help="Consumption, all five axes.")
@click.pass_obj
def usage(ctx: Ctx, lineage: str, amount: str) -> None:
    """Charge consumption to LINEAGE's lease (clamped to what it holds)."""
    with ctx.open_charter() as charter:
        event = charter.budgets().record_usage(lineage, Budget.parse(amount))
    text = f"charged {event.amount.render()} to {lineage}"
    if event.exhausted:
        text += " (lease exhausted)"
    if event.refused != Budget.zero():
        text += f"; not charged: {event.refused.render()}"
    ctx.emit(event.payload(), text)


@lease_group.command("release")
@click.argument("lineage")
@click.pass_obj
def release(ctx: Ctx, lineage: str) -> None:
    """End LINEAGE's lease (and its subtree's); the unspent part returns to its parent."""
    with ctx.open_charter() as charter:
        event = charter.budgets().release(lineage)
    ctx.emit(event.payload(), f"released {lineage}")


@lease_group.command("renew")
@click.argument("lineage")
@click.option(
    "--until-ms",
    "until_ms",
    required=True,
    type=AsciiIntRange(0, INT64_MAX),
    help="New expiry (epoch ms).",
)
@click.pass_obj
def renew(ctx: Ctx, lineage: str, until_ms: int) -> None:
    """Extend LINEAGE's lease, never past its parent's."""
    with ctx.open_charter() as charter:
        event = charter.budgets().renew(lineage, until_ms)
    ctx.emit(event.payload(), f"renewed {lineage} until {event.expires_at_ms} ms")
