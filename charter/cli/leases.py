"""``charter lease usage|release|renew``: the operator's (and, until the runner records
them itself, the tests') way to charge and end leases."""

from __future__ import annotations

import click

from charter.budgets import MAX_EXPIRY_MS, BudgetRefused, render_instant
from charter.cli._common import AsciiIntRange, Ctx
from charter.core import Budget, BudgetSyntaxError
from charter.core.budget import MAX_TTL_S, parse_duration_ms
from charter.core.text import shown
from charter.runner.errors import WorkerRunningError
from charter.runner.status import running_below

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
    """End LINEAGE's lease (and its subtree's); the unspent part returns to its parent.

    Refused (exit 4, journaled) while a worker at or below LINEAGE runs: what it uses
    would be charged nowhere. `charter revoke LINEAGE` stops it and charges it first."""
    with ctx.open_charter() as charter:
        running = running_below(charter.journal, lineage)
        if running:
            error = WorkerRunningError(
                f"{shown(running[0])} is running under {shown(lineage)}'s lease: releasing "
                f"it would leave what it uses charged nowhere; `charter revoke {lineage}` "
                "stops the subtree and charges it before its leases return"
            )
            charter.journal.record_refusal(
                BudgetRefused(
                    lineage=lineage, operation="release", reason=error.reason, message=str(error)
                ),
                error,
            )
            raise error
        event = charter.budgets().release(lineage)
    ctx.emit(event.payload(), f"released {lineage}")


# The longest renewal asked for as a duration: a century, the longest a grant may live
# (MAX_TTL_S), so now + it is a date that renders. Checked here, before anything is
# journaled: a longer one is bad input (exit 2), never a commit the CLI then cannot show.
MAX_RENEWAL_MS = MAX_TTL_S * 1000


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        ms = parse_duration_ms(value)
    except BudgetSyntaxError:
        raise click.BadParameter(f"{value!r} is not a duration; write 90s, 10m or 2h") from None
    if ms > MAX_RENEWAL_MS:
        raise click.BadParameter(
            f"{value!r} is longer than a lease may be renewed for (at most "
            f"{MAX_RENEWAL_MS // 3_600_000}h, a century)"
        )
    return ms


@lease_group.command("renew")
@click.argument("lineage")
@click.option(
    "--for",
    "for_ms",
    callback=_duration,
    metavar="DURATION",
    help="New expiry: this long from now (90s, 10m, 2h).",
)
@click.option(
    "--until-ms",
    "until_ms",
    # At most the last instant a date renders (the end of year 9999): bad input beyond.
    type=AsciiIntRange(0, MAX_EXPIRY_MS),
    help="New expiry as epoch milliseconds.",
)
@click.pass_obj
def renew(ctx: Ctx, lineage: str, for_ms: int | None, until_ms: int | None) -> None:
    """Extend LINEAGE's lease (--for 10m, or --until-ms MS), never past its parent's."""
    if (for_ms is None) == (until_ms is None):
        raise click.UsageError("give exactly one of --for DURATION and --until-ms MS")
    with ctx.open_charter() as charter:
        service = charter.budgets()
        until = until_ms if until_ms is not None else service.clock() + (for_ms or 0)
        event = service.renew(lineage, until)
    # After the commit nothing may fail: render_instant shows any stored end.
    ctx.emit(event.payload(), f"renewed {lineage} until {render_instant(event.expires_at_ms)}")
