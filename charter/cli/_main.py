"""The root ``charter`` group: global options, error-to-exit-code mapping, sub-commands."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from charter.cli._common import Ctx, run_guarded

__all__ = ["main"]

# Each module exposes ``register(group)``; one module per area keeps cli/ thin.
_COMMAND_MODULES = ("journal", "agents", "leases", "sandbox", "projections")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    "db",
    envvar="CHARTER_DB",
    default=None,
    metavar="URL",
    help="Journal URL: sqlite:///path or postgresql://user@host:port/db "
    "(default: CHARTER_DB, else the SQLite file in CHARTER_HOME).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or status lines on stderr.")
@click.version_option(package_name="charter")
@click.pass_context
def cli(ctx: click.Context, db: str | None, as_json: bool, quiet: bool) -> None:
    """Charter: the control plane for AI-agent fan-out."""
    ctx.obj = Ctx(db=db, as_json=as_json, quiet=quiet or not sys.stderr.isatty())


for _name in _COMMAND_MODULES:
    importlib.import_module(f"charter.cli.{_name}").register(cli)


def main(argv: list[str] | None = None) -> Any:
    """Entry point: maps Charter errors to the exit codes of CLI.md."""
    return run_guarded(cli, argv)
