"""``charter sandbox probe|run|spec``: thin wrappers over charter.sandbox."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import click
from pydantic import ValidationError

from charter.app import Charter, Journal
from charter.cli._common import Ctx, describe_invalid
from charter.core import Budget, StateError
from charter.sandbox import (
    FIRST_SANDBOX_UID,
    BwrapFds,
    CgroupMode,
    EgressGrant,
    HostCannotIsolateError,
    HostFacts,
    compile_spec,
    probe,
    reap_host,
    refuse,
    render_bwrap,
    render_cgroup,
    render_oci,
    render_seccomp,
)

__all__ = ["sandbox_group"]

DEFAULT_BUDGET = "tokens=0,wall=10m,cpu=10m,mem=512MiB,egress=0MB"
EXIT_INTERRUPTED = 130  # 128 + SIGINT: a Ctrl-C, as a shell reports it (docs/cli.md)


@contextlib.contextmanager
def _journal(ctx: Ctx, *, required: bool) -> Iterator[Journal | None]:
    """The journal at --db, or None when there is none and it is not required."""
    try:
        charter = Charter.open(ctx.db)
    except StateError:
        if required:
            raise
        yield None
        return
    with charter:
        yield charter.journal


@click.group("sandbox")
def sandbox_group() -> None:
    """Probe the host, run a command in a sandbox, or print a compiled spec."""


@sandbox_group.command("probe")
@click.pass_obj
def probe_cmd(ctx: Ctx) -> None:
    """Run the live canary; exit 0 with every property checked, or 4 naming what fails.
    The canary sandbox and a refusal are journaled when a journal exists at --db."""

    with _journal(ctx, required=False) as journal:
        if journal is None:
            ctx.status("no journal at --db: the canary and any refusal are not journaled")
        report = probe(journal)

        def text() -> None:
            for check in report.checks:
                click.echo(f"{'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")

        ctx.emit(report.model_dump(mode="json"), text)
        if report.ok:
            return
        refusal = refuse(report, journal)
    raise refusal


@sandbox_group.command("run", context_settings={"ignore_unknown_options": True})
@click.option(
    "--budget",
    "budget_text",
    default=DEFAULT_BUDGET,
    show_default=True,
    metavar="VECTOR",
    help="Budget vector the caps are compiled from.",
)
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Directory bound read-write at /workspace (default: a fresh empty one).",
)
@click.option(
    "--egress",
    "egress",
    default="",
    metavar="HOST,…",
    help="Destinations the egress broker allows: host, *.domain, either with :port.",
)
@click.option(
    "--secrets",
    "secret_names",
    default="",
    metavar="A,B",
    help="Held secrets the broker presents at their bound destinations (charter secret).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="A test run: every held secret is withheld (journaled); its destinations are not reached.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def run_cmd(
    ctx: Ctx, budget_text: str, workspace: Path | None, egress: str, secret_names: str,
    dry_run: bool, command: tuple[str, ...],
) -> None:  # fmt: skip
    """Compile the spec from the budget and run COMMAND in a real sandbox.

    Exits with COMMAND's own code; 124 past the wall clock; 128+N on signal N; 4 when
    the host cannot isolate. Requires an initialised journal (the lifecycle is journaled).
    """

    budget = Budget.parse(budget_text)
    if os.geteuid() != 0:  # before anything touches the root-owned sandbox state
        raise HostCannotIsolateError(
            "charter sandbox run needs root (it sets up user namespaces, cgroups and the "
            "sandbox uid range); run it as root"
        )
    # The broker caps egress at the budget's bytes (the spec's); the grant only names
    # where to, in the grant's own destination vocabulary (validated here).
    try:
        grant = EgressGrant(
            destinations=tuple(d.strip() for d in egress.split(",") if d.strip()),
            secrets=tuple(sorted({n.strip() for n in secret_names.split(",") if n.strip()})),
            withhold_credentials=dry_run,
        )
    except ValidationError as e:
        raise click.BadParameter(describe_invalid(e), param_hint="--egress/--secrets") from e
    if dry_run:  # said whatever the terminal (a test run must never pass for a real one)
        held = ", ".join(grant.secrets) or "none named"
        said = (
            f"dry run: every held credential is withheld ({held}); a destination one is "
            "bound to is not reached, and each withholding is journaled"
        )
        click.echo(said, err=True)
    with Charter.open(ctx.db) as charter:
        # With --json stdout carries only the result document; the command's output
        # goes to stderr.
        try:
            outcome = charter.run_sandbox(
                budget, list(command), workspace=workspace, egress=grant,
                stdout=sys.stderr.fileno() if ctx.as_json else None,
            )  # fmt: skip
        except KeyboardInterrupt:
            # Ctrl-C: the launcher killed the sandbox and journaled its end (how
            # "interrupted"); the exit code is a shell's for SIGINT.
            ctx.status("interrupted: the sandbox was killed and its end journaled")
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    result = outcome.model_dump(mode="json", exclude={"stdout", "stderr"})
    result["credentials_withheld"] = list(grant.secrets) if dry_run else []
    if ctx.as_json:
        ctx.emit(result, "")
    else:
        ctx.status(f"sandbox {outcome.sandbox_id}: {outcome.how}, exit {outcome.exit_code}")
    raise click.exceptions.Exit(outcome.exit_code)


@sandbox_group.command("reap")
@click.pass_obj
def reap_cmd(ctx: Ctx) -> None:
    """Clean up after launchers that were killed: their sandboxes, cgroups and sockets."""

    removed = reap_host()
    ctx.emit({"removed": removed}, f"removed {removed}")


@sandbox_group.command("spec")
@click.option(
    "--budget", "budget_text", default=DEFAULT_BUDGET, show_default=True, metavar="VECTOR"
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["bwrap", "oci", "json"]),
    default="json",
    show_default=True,
)
@click.option(
    "--workspace",
    default="/path/to/workspace",
    show_default=True,
    help="Host workspace path to render (nothing is created).",
)
@click.option(
    "--cgroup", "cgroup", type=click.Choice(["v1", "v2"]), default="v1", show_default=True
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def spec_cmd(
    ctx: Ctx, budget_text: str, fmt: str, workspace: str, cgroup: str, command: tuple[str, ...]
) -> None:  # fmt: skip
    """Print the compiled spec or its rendering, without running anything."""

    facts = HostFacts(
        sandbox_id="spec", host_uid=FIRST_SANDBOX_UID, host_gid=FIRST_SANDBOX_UID,
        workspace=workspace, cgroup_mode=CgroupMode(cgroup), host_cpus=os.cpu_count() or 1,
    )  # fmt: skip
    spec = compile_spec(Budget.parse(budget_text), facts)
    argv = list(command) or ["/bin/sh"]
    if fmt == "bwrap":
        # Placeholder fd numbers: the launcher passes the BPF program and files as fds.
        rendered = render_bwrap(spec, argv, BwrapFds(3, tuple(range(4, 4 + len(spec.files)))))
        ctx.emit(rendered, shlex.join(rendered))
    elif fmt == "oci":
        config = render_oci(spec, argv)
        ctx.emit(config, json.dumps(config, indent=2, sort_keys=True))
    else:
        data = {
            "spec": spec.model_dump(mode="json"),
            "cgroup": render_cgroup(spec),
            "seccomp_bpf_bytes": len(render_seccomp(spec)),
        }
        ctx.emit(data, json.dumps(data, indent=2, sort_keys=True))
