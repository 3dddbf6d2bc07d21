"""``charter agent add|list``, ``charter spawn`` and ``charter spawn-schema``.

``grant_options`` is shared with ``charter init``: it adds the ceiling-grant options
and hands the command one parsed :class:`~charter.control.Ceiling` as ``ceiling``.
"""

from __future__ import annotations

import functools
import getpass
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from charter.authority import (
    MAX_FANOUT,
    Clearance,
    PermissionMode,
    RequestedGrant,
    SpawnIntent,
    spawn_tool_definition,
)
from charter.cli._common import (
    EXIT_REFUSED,
    AsciiIntRange,
    Ctx,
    cell_classes,
    describe_invalid,
    json_option,
)
from charter.cli.scan import load as load_definitions
from charter.cli.scan import scan_home as scan_definitions
from charter.control import AgentRecord, Ceiling, WorkerSpec
from charter.core import MAX_LINEAGE_DEPTH, Budget, CharterError, RefusedError
from charter.core.home import charter_home

__all__ = ["DEFAULT_CEILING_BUDGET", "agent_group", "grant_options", "spawn", "spawn_schema"]

DEFAULT_CEILING_BUDGET = "tokens=10M,wall=8h,cpu=8h,mem=16GiB,egress=10GB"
F = TypeVar("F", bound=Callable[..., Any])


def _names(value: str) -> frozenset[str]:
    return frozenset(part.strip() for part in value.split(",") if part.strip())


def _default(field: str) -> Any:
    """A ceiling option's default: the one :class:`Ceiling` declares."""
    return Ceiling.model_fields[field].default


def grant_options(command: F) -> F:
    """Add --budget/--clearance/--mode/--depth/--fanout/--tools/--egress/--secrets/--ttl
    and pass the command a validated ``ceiling: Ceiling`` instead of them."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        raw = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("grant_")}
        try:
            ceiling = Ceiling(
                budget=Budget.parse(raw["grant_budget"]),
                clearance=Clearance(raw["grant_clearance"]),
                mode=PermissionMode(raw["grant_mode"]),
                depth=raw["grant_depth"],
                fanout=raw["grant_fanout"],
                tools=_names(raw["grant_tools"]),
                egress=_names(raw["grant_egress"]),
                secrets=_names(raw["grant_secrets"]),
                ttl_s=raw["grant_ttl"],
            )
        except ValidationError as e:
            raise click.BadParameter(describe_invalid(e)) from e
        except CharterError as e:
            raise click.BadParameter(str(e)) from e
        return command(*args, ceiling=ceiling, **kwargs)

    options = [
        click.option(
            "--budget",
            "grant_budget",
            default=DEFAULT_CEILING_BUDGET,
            show_default=True,
            metavar="VECTOR",
            help="Budget ceiling: tokens=…,wall=…,cpu=…,mem=…,egress=… (all five axes).",
        ),
        click.option(
            "--clearance",
            "grant_clearance",
            type=click.Choice([c.value for c in Clearance]),
            default=_default("clearance").value,
            show_default=True,
            help="Highest data clearance (ordered, lowest first).",
        ),
        click.option(
            "--mode",
            "grant_mode",
            type=click.Choice([m.value for m in PermissionMode]),
            default=_default("mode").value,
            show_default=True,
            help="Permission mode (ordered, least permissive first).",
        ),
        click.option(
            "--depth",
            "grant_depth",
            type=AsciiIntRange(0, MAX_LINEAGE_DEPTH),
            default=_default("depth"),
            show_default=True,
            help="Levels of spawning below this agent.",
        ),
        click.option(
            "--fanout",
            "grant_fanout",
            type=AsciiIntRange(0, MAX_FANOUT),
            default=_default("fanout"),
            show_default=True,
            help="Children this agent may spawn in all.",
        ),
        click.option("--tools", "grant_tools", default="", metavar="A,B", help="Tool names."),
        click.option(
            "--egress",
            "grant_egress",
            default="",
            metavar="HOST,…",
            help="Egress destinations: exact hosts or *.domain patterns.",
        ),
        click.option("--secrets", "grant_secrets", default="", metavar="A,B", help="Secret names."),
        click.option(
            "--ttl",
            "grant_ttl",
            type=AsciiIntRange(1),
            default=_default("ttl_s"),
            show_default=True,
            metavar="SECONDS",
            help="Seconds until the ceiling grant expires.",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


def _describe(record: AgentRecord) -> str:
    return f"{record.lineage}  trust root {record.trust_root.hex()}"


@click.group("agent")
def agent_group() -> None:
    """The directory of durable agents."""


@agent_group.command("add")
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD ARGS...]")
@click.option(
    "--own-sandbox",
    "own_sandbox",
    is_flag=True,
    help="An agent workers delegate to (docs/delegation.md): each delegation runs "
    "CMD ARGS in a sandbox of its own under this ceiling (its tools, egress, secrets) "
    "and reserves --delegate-budget from the caller.",
)
@click.option(
    "--delegate-budget",
    "delegate_budget",
    metavar="VECTOR",
    help="What one delegation reserves from its caller (all five axes; within --budget).",
)
@click.option(
    "--from",
    "definition",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Take NAME's profile from a definition file (docs/scan.md): its egress, "
    "secrets, tools, run and [limits] budget replace the options; implies --own-sandbox "
    'for sandbox = "own". The file must scan clean.',
)
@grant_options
@click.pass_obj
def agent_add(
    ctx: Ctx,
    name: str,
    command: tuple[str, ...],
    own_sandbox: bool,
    delegate_budget: str | None,
    definition: Path | None,
    ceiling: Ceiling,
) -> None:
    """Register durable agent NAME: a custody key in the Charter home, a directory entry
    with its trust root, and its ceiling grant, journaled together.

    With --own-sandbox and `-- CMD ARGS...` (or --from FILE), NAME is an own-sandbox
    agent: workers delegate to it through their door, and each delegation runs CMD in a
    sandbox of its own under NAME's ceiling, never the caller's."""
    reserve = _budget(delegate_budget) if delegate_budget is not None else None
    if definition is not None:
        if command or reserve is not None:
            raise click.UsageError("--from takes the program and budget from the file")
        ceiling, command, reserve, own_sandbox = _from_definition(definition, name, ceiling)
    if own_sandbox and not (command and reserve is not None):
        raise click.UsageError(
            "--own-sandbox runs a program under a budget: give --delegate-budget and -- CMD ARGS..."
        )
    if (command or reserve is not None) and not own_sandbox:
        raise click.UsageError("CMD ARGS and --delegate-budget are an own-sandbox agent's")
    with ctx.open_charter() as charter:
        record = charter.add_agent(
            name, ceiling, own_sandbox=command or None, delegate_budget=reserve
        )
    ctx.status(f"registered {record.lineage}" + (" (own sandbox)" if own_sandbox else ""))
    ctx.emit({**record.to_json(), "own_sandbox": list(command) or None}, _describe(record))


def _budget(text: str) -> Budget:
    try:
        return Budget.parse(text)
    except (CharterError, ValueError) as e:
        raise click.BadParameter(str(e), param_hint="--delegate-budget") from e


def _from_definition(
    path: Path, name: str, ceiling: Ceiling
) -> tuple[Ceiling, tuple[str, ...], Budget | None, bool]:
    """NAME's ceiling, program and delegation budget from a definition file, which must
    scan clean (the findings are printed and the command exits 4, as `charter scan`
    would)."""
    definitions = load_definitions(path)
    found = [a for a in definitions.agent if a.name == name]
    if not found:
        raise click.BadParameter(f"{path} defines no agent {name!r}", param_hint="--from")
    scanned = scan_definitions(definitions, str(path), home=charter_home())
    findings = [f for f in scanned if f.agent == name]
    if findings:
        for f in findings:
            click.echo(f"{f.file}: {f.agent}: {f.rule}: {f.detail}", err=True)
        click.echo(f"charter: refused: {path} does not scan clean for {name}", err=True)
        raise click.exceptions.Exit(EXIT_REFUSED)
    agent = found[0]
    try:
        built = Ceiling.model_validate(
            ceiling.model_dump()
            | {
                "egress": frozenset(agent.egress),
                "secrets": frozenset(agent.secrets),
                "tools": frozenset(agent.tools),
            }
        )
    except ValidationError as e:
        raise click.BadParameter(f"{path}: {describe_invalid(e)}") from e
    if agent.sandbox != "own":
        return built, (), None, False
    limits = agent.limits
    if not agent.run or limits is None or limits.budget is None:  # scanned: limits whole
        raise click.BadParameter(f"{path}: agent {name}: an own-sandbox agent needs `run`")
    if limits.depth or limits.fanout:
        raise click.BadParameter(
            f"{path}: agent {name}: a delegate cannot spawn or delegate (depth one): its "
            "[limits] depth and fanout must be 0"
        )
    return built, agent.run, Budget.parse(limits.budget), True


@agent_group.command("list")
@click.pass_obj
def agent_list(ctx: Ctx) -> None:
    """List the durable agents in the directory."""
    with ctx.open_charter() as charter:
        records = charter.agents()
    ctx.emit(
        [r.to_json() for r in records],
        "\n".join(_describe(r) for r in records) if records else "(no agents)",
    )


def _read_grant(value: str | None) -> RequestedGrant:
    if value is None:
        return RequestedGrant()
    return json_option(RequestedGrant, value, "a requested grant")


@click.command("spawn")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD ARGS...]")
@click.option("--parent", required=True, metavar="LINEAGE", help="A durable agent: agent:NAME.")
@click.option("--width", required=True, type=AsciiIntRange(1), help="Workers to start.")
@click.option("--objective", required=True, help="What the workers are for.")
@click.option("--est-cost", "est_cost", required=True, metavar="VECTOR", help="Total estimate.")
@click.option("--grant", "grant", metavar="JSON|@FILE", help="Requested grant per worker.")
@click.option(
    "--dry-run",
    "dry_run",
    is_flag=True,
    help="A test run: every held credential is withheld from the workers and their "
    "descendants (journaled); those destinations are not reached.",
)
@click.option(
    "--cell",
    "cell",
    default=None,
    metavar="NAME",
    help="Run the workers on this cell, live or not (they queue there until it runs).",
)
@click.option(
    "--class",
    "cell_class",
    default=None,
    metavar="NAME",
    callback=cell_classes,
    help="Run the workers only on a live cell of this class (`cell run --class`); "
    "refused (exit 4, no-cell-of-class) when none is live.",
)
@click.pass_obj
def spawn(
    ctx: Ctx,
    command: tuple[str, ...],
    parent: str,
    width: int,
    objective: str,
    est_cost: str,
    grant: str | None,
    dry_run: bool,
    cell: str | None,
    cell_class: str | None,
) -> None:
    """Fan out WIDTH workers under a durable agent; print the minted lineages.

    With `-- CMD ARGS...`, each worker is scheduled to run CMD in its own sandbox on a
    live cell by the placement rule (docs/fabric.md; `charter cell run` starts it), on
    `--cell`, or on a live cell of `--class`; without, the children are minted and
    leased only. Exit 4 with the journaled reason when refused.
    """
    try:
        intent = SpawnIntent(
            width=width,
            objective=objective,
            grant=_read_grant(grant),
            estimated_cost=Budget.parse(est_cost),
        )
    except ValidationError as e:
        raise click.BadParameter(describe_invalid(e)) from e
    for flag, given in (("--dry-run", dry_run), ("--cell", cell), ("--class", cell_class)):
        if given and not command:
            raise click.UsageError(f"{flag} runs workers: give -- CMD ARGS...")
    if cell is not None and cell_class is not None:
        raise click.UsageError(
            "--cell names where the workers run, --class what cell they need: give one"
        )
    workers = (
        (WorkerSpec(argv=command, dry_run=dry_run, cell=cell, cell_class=cell_class),)
        if command
        else None
    )
    with ctx.open_charter() as charter:
        try:
            result = charter.spawn(parent, intent, workers=workers)
        except RefusedError as e:
            ctx.emit(
                {"refused": True, "reason": e.reason, "error": type(e).__name__, "message": str(e)},
                lambda: None,
            )
            click.echo(f"charter: refused ({e.reason}): {e}", err=True)
            raise click.exceptions.Exit(EXIT_REFUSED) from e
    ctx.status(
        f"gate {result.gate.verdict}: {result.gate.reason}; minted {len(result.children)} "
        f"at positions {result.positions[0]}-{result.positions[1]}"
        + (f"; {len(result.queued)} queued for a slot" if result.queued else "")
    )
    if dry_run:  # said whatever the terminal, as `sandbox run --dry-run` does
        click.echo(
            "charter: a test run: every held credential is withheld from these workers "
            "and their descendants (journaled as CredentialWithheld at each dial)",
            err=True,
        )
    ctx.emit(
        {**result.to_json(), "dry_run": dry_run},
        "\n".join(str(c.lineage) for c in result.children),
    )


@click.command("revoke")
@click.argument("lineage")
@click.option("--reason", default="", help="Why (journaled with the revocation).")
@click.pass_obj
def revoke(ctx: Ctx, lineage: str, reason: str) -> None:
    """Revoke LINEAGE (a worker) and its whole subtree, in one append.

    From that position none of them may spawn, be admitted or start; the cell that runs
    them kills what runs (each kill journaled first), charges what they used and returns
    their leases. Revoking a lineage that already was revoked changes nothing.
    """
    with ctx.open_charter() as charter:
        position = charter.revoke(lineage, reason)
    done = position is not None
    ctx.status(f"revoked {lineage} at position {position}" if done else f"{lineage} was revoked")
    ctx.emit({"lineage": lineage, "revoked": True, "position": position}, lineage)


@click.command("spawn-schema")
def spawn_schema() -> None:
    """Print the JSON Schema of the spawn intent, as a model tool definition."""
    click.echo(json.dumps(spawn_tool_definition(), indent=2, sort_keys=True))


@click.command("verdict")
@click.argument("lineage")
@click.argument("action", type=click.Choice(["throttle", "pause", "resume", "kill", "quarantine"]))
@click.option("--reason", default="", help="Why (journaled as the verdict's evidence).")
@click.option(
    "--quota",
    "quota",
    type=AsciiIntRange(min=1, max=1_000_000),
    default=None,
    metavar="PERMILLE",
    help="throttle: the CPU quota, in thousandths of a core (default: the policy's).",
)
@click.pass_obj
def verdict(ctx: Ctx, lineage: str, action: str, reason: str, quota: int | None) -> None:
    """Append a verdict on LINEAGE's running worker; the cell that runs it acts on it.

    throttle lowers its CPU quota, pause freezes it (its wall clock and lease still run),
    resume thaws it and restores its quota, kill freezes and kills it, quarantine
    freezes it, journals its workspace's digest, kills it and revokes its subtree. The
    evidence names you (the OS user) and --reason. A verdict on a worker that has ended
    changes nothing.
    """
    if quota is not None and action != "throttle":
        raise click.UsageError("--quota is for throttle only")
    with ctx.open_charter() as charter:
        position = charter.verdict(
            lineage, action, reason=reason, quota_permille=quota,  # type: ignore[arg-type]
            operator=getpass.getuser(),
        )  # fmt: skip
    ctx.status(f"{action} verdict on {lineage} at position {position}")
    ctx.emit({"lineage": lineage, "verdict": action, "position": position}, str(position))
