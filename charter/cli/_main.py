"""The root ``charter`` group: global options, lazily loaded sub-commands, and the one
place where errors become exit codes.

Sub-commands are imported only when they run, so ``charter --help`` and a typo answer
without loading pydantic, the journal or the sandbox.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from charter.cli._common import Ctx, run_guarded, stdout_closed

__all__ = ["main"]

# name -> (module under charter.cli, attribute, one-line help for the listing)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": ("journal", "init", "Create the journal, the home, the root agent and the cell."),
    "agent": ("agents", "agent_group", "The directory of durable agents."),
    "spawn": ("agents", "spawn", "Fan out workers under a durable agent."),
    "spawn-schema": ("agents", "spawn_schema", "Print the JSON Schema of the spawn intent."),
    "lease": ("leases", "lease_group", "Record usage against a lease, release or renew it."),
    "cell": ("cells", "cell_group", "Run a cell, or configure its slot caps."),
    "budgets": ("projections", "budgets", "Budget ledgers and leases (a projection)."),
    "tree": ("projections", "tree", "The lineage tree (a projection)."),
    "slots": ("projections", "slots", "Slot occupancy per cell (a projection)."),
    "project": ("projections", "project", "Bring the projections up to date, or rebuild them."),
    "journal": ("journal", "journal", "Inspect and verify the journal."),
    "sandbox": ("sandbox", "sandbox_group", "Probe the host, run or render a sandbox."),
    "demo": ("demo", "demo", "Run the main job: a real two-level fan-out, verified."),
    "checkpoint": ("audit", "checkpoint", "A signed checkpoint of the journal's Merkle tree."),
    "witness": ("audit", "witness", "Cosign consistent checkpoints of a log; refuse forks."),
    "proof": ("audit", "proof", "Inclusion and consistency proofs of the journal."),
    "export": ("audit", "export", "Export bundles, and verify one offline."),
    "audit": ("audit", "audit_cmd", "Semantic audits of the journal; exit 3 on a finding."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.commands, *_COMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = _COMMANDS.get(cmd_name)
        if found is None:
            return super().get_command(ctx, cmd_name)
        module, attr, _ = found
        command: click.Command = getattr(importlib.import_module(f"charter.cli.{module}"), attr)
        return _accept_global_options(command)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise stdout_closed() from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, short) for name, (_, _, short) in _COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# Global options are accepted after the command name too (`charter budgets --json`):
# each leaf command gets them as its own options, merged into the root's Ctx.
_GLOBAL_NAMES = ("db", "as_json", "quiet")
_given_globals: set[int] = set()  # commands already given them (they are singletons)


def _global_params() -> list[click.Parameter]:
    return [
        click.Option(
            ["--db", "db"], default=None, metavar="URL", help="Same as before the command."
        ),
        click.Option(["--json", "as_json"], is_flag=True, help="Same as before the command."),
        click.Option(["--quiet", "-q", "quiet"], is_flag=True, help="Same as before the command."),
    ]


def _accept_global_options(command: click.Command) -> click.Command:
    if id(command) in _given_globals:
        return command
    _given_globals.add(id(command))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _accept_global_options(sub)
        return command
    taken = {opt for param in command.params for opt in getattr(param, "opts", ())}
    command.params.extend(p for p in _global_params() if not set(p.opts) & taken)
    callback = command.callback
    if callback is not None:

        def with_globals(**kwargs: Any) -> Any:
            # a value given after the name wins over one given before it
            given = {name: kwargs.pop(name, None) for name in _GLOBAL_NAMES}
            ctx = click.get_current_context()
            before: Ctx = ctx.obj
            ctx.obj = Ctx(
                db=given["db"] or before.db,
                as_json=bool(given["as_json"]) or before.as_json,
                quiet=bool(given["quiet"]) or before.quiet,
            )
            return callback(**kwargs)

        command.callback = with_globals
    return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    "db",
    envvar="CHARTER_DB",
    default=None,
    metavar="URL",
    help="Journal URL: sqlite:///path or postgresql://user@host:port/db "
    "(default: CHARTER_DB, else the SQLite file in the Charter home).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or status lines on stderr.")
@click.version_option(package_name="charter")
@click.pass_context
def cli(ctx: click.Context, db: str | None, as_json: bool, quiet: bool) -> None:
    """Charter: the control plane for AI-agent fan-out."""
    ctx.obj = Ctx(db=db, as_json=as_json, quiet=quiet or not sys.stderr.isatty())


def main(argv: list[str] | None = None) -> Any:
    """Entry point: maps Charter errors to the exit codes of docs/cli.md."""
    return run_guarded(cli, argv)
