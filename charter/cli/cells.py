"""``charter cell configure``: journal a cell's slot caps (``charter slots`` shows them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from charter.app import CellSetup
from charter.cli._common import AsciiIntRange, Ctx, describe_invalid

__all__ = ["cell_group"]

FC = TypeVar("FC", bound=Callable[..., Any])


@click.group("cell")
def cell_group() -> None:
    """Cells: the hosts that run workers, and their slot caps."""


def _cap(name: str, text: str) -> Callable[[FC], FC]:
    return click.option(f"--{name}", type=AsciiIntRange(0, 1_000_000), default=None, help=text)


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
