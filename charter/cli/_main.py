"""The root ``charter`` group: global options, lazily loaded sub-commands, and the one
place where errors become exit codes.

Sub-commands are imported only when they run, so ``charter --help`` and a typo answer
without loading pydantic, the journal or the sandbox. ``charter X --help`` and shell
completion do not import them either: they are answered by stand-ins built from the
commands' recorded shape (``_lazy.py``, ``_index.py``).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from charter.cli._common import Ctx, run_guarded, stdout_closed

__all__ = ["main", "real_commands"]

# name -> (module under charter.cli, attribute, one-line help for the listing)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": ("journal", "init", "Create the journal, the home, the root agent and the cell."),
    "agent": ("agents", "agent_group", "The directory of durable agents."),
    "spawn": ("agents", "spawn", "Fan out workers under a durable agent."),
    "spawn-schema": ("agents", "spawn_schema", "Print the JSON Schema of the spawn intent."),
    "revoke": ("agents", "revoke", "Revoke a worker and its subtree; the cell kills what runs."),
    "verdict": ("agents", "verdict", "Throttle, pause, resume, kill or quarantine a worker."),
    "lease": ("leases", "lease_group", "Record usage against a lease, release or renew it."),
    "cell": ("cells", "cell_group", "Run a cell, or configure its slot caps."),
    "logs": ("logs", "logs", "A worker's live stdout and stderr tail (-f to follow)."),
    "budgets": ("projections", "budgets", "Budget ledgers and leases (a projection)."),
    "tree": ("projections", "tree", "The lineage tree (a projection)."),
    "slots": ("projections", "slots", "Slot occupancy per cell (a projection)."),
    "project": ("projections", "project", "Bring the projections up to date, or rebuild them."),
    "journal": ("journal", "journal", "Inspect and verify the journal."),
    "sandbox": ("sandbox", "sandbox_group", "Probe the host, run or render a sandbox."),
    "model": ("model", "model_group", "The model endpoint workers reach through their door."),
    "secret": ("secrets", "secret_group", "Credentials held for workers, never in a sandbox."),
    "keys": ("secrets", "keys_group", "Publish Charter's public keys (the identity JWKS)."),
    "demo": ("demo", "demo", "Run the main job: a real two-level fan-out, verified."),
    "checkpoint": ("proofs", "checkpoint", "A signed checkpoint of the journal's Merkle tree."),
    "witness": ("audit", "witness", "Cosign consistent checkpoints of a log; refuse forks."),
    "proof": ("proofs", "proof", "Inclusion and consistency proofs of the journal."),
    "export": ("audit", "export", "Export bundles, and verify one offline."),
    "audit": ("audit", "audit_cmd", "Semantic audits of the journal; exit 3 on a finding."),
    "scan": (
        "scan",
        "scan_cmd",
        "Lint agent definitions (the lethal trifecta, …); 4 on a finding.",
    ),
    "mcp": ("mcp", "mcp_group", "Serve Charter's tools to an MCP client (stdio or HTTP)."),
    "serve": ("serve", "serve_group", "Serve the read-only operator page of the fabric."),
}


# ctx.meta keys: answer with stand-ins (help or completion), or never (a stand-in ran)
_STAND_INS = "charter.stand_ins"
_REAL_ONLY = "charter.real_only"
_stand_ins: dict[str, click.Command] = {}


def _asks_for_help(ctx: click.Context, args: list[str]) -> bool:
    """Whether ``args`` (the command and what follows it) hold a help option before any
    ``--``. If it turns out to be an option's value, the stand-in runs and the real
    command is run instead (:class:`~charter.cli._lazy.StandInInvoked`)."""
    before = args[: args.index("--")] if "--" in args else args
    return any(arg in ctx.help_option_names for arg in before)


_index_current: list[bool] = []  # once a process: is the index the sources'?


def _stand_in(name: str) -> click.Command | None:
    """The stand-in of ``name``, or None when the index is not of these sources."""
    if name not in _stand_ins:
        from charter.cli._help import sources_digest
        from charter.cli._index import INDEX, SOURCES
        from charter.cli._lazy import stand_in

        if not _index_current:
            _index_current.append(sources_digest() == SOURCES)
        if name not in INDEX or not _index_current[0]:
            return None
        _stand_ins[name] = stand_in(INDEX[name])
    return _stand_ins[name]


def _real_command(name: str) -> click.Command:
    module, attr, _ = _COMMANDS[name]
    command: click.Command = getattr(importlib.import_module(f"charter.cli.{module}"), attr)
    return _accept_global_options(command)


def real_commands() -> dict[str, click.Command]:
    """Every lazily loaded command, imported (what ``_index.py`` is generated from)."""
    from charter.cli._lazy import LazyGroup

    commands = {name: _real_command(name) for name in _COMMANDS}
    for command in commands.values():
        if isinstance(command, LazyGroup):
            command.load_all()
    return commands


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.commands, *_COMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return super().get_command(ctx, cmd_name)
        wanted = ctx.resilient_parsing or ctx.meta.get(_STAND_INS)  # completion, help
        if wanted and not ctx.meta.get(_REAL_ONLY):
            found = _stand_in(cmd_name)
            if found is not None:
                return found
        return _real_command(cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        ctx.meta[_STAND_INS] = ctx.resilient_parsing or _asks_for_help(ctx, args)
        name = args[0] if args else ""
        if (
            not ctx.resilient_parsing
            and not name.startswith("-")
            and self.get_command(ctx, name) is None
        ):
            import difflib  # only for a mistyped command

            close = difflib.get_close_matches(name, self.list_commands(ctx))
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        from charter.cli._lazy import StandInInvoked

        # Group.invoke consumes the arguments; a stand-in that ran needs them again
        field = "_protected_args" if hasattr(ctx, "_protected_args") else "protected_args"
        saved = (list(getattr(ctx, field)), list(ctx.args))
        try:
            try:
                return super().invoke(ctx)
            except StandInInvoked:  # no help was shown after all: run the real command
                setattr(ctx, field, saved[0])
                ctx.args = saved[1]
                ctx.meta[_REAL_ONLY] = True
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
    from charter.cli._lazy import LazyGroup  # as StandInInvoked: not for `--version`

    if isinstance(command, LazyGroup):  # each sub-command as it is imported
        command.on_load(_accept_global_options)
        return command
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
