"""``charter demo``: the main job, in a fresh home, with a live lineage tree on stderr."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.live import Live
from rich.tree import Tree

from charter.cli._common import Ctx
from charter.cli._render import printable, rich_safe
from charter.runner.demo import DemoOutcome, run_demo
from charter.runner.status import Row

__all__ = ["demo"]

_STYLE = {
    "queued": "yellow",
    "admitted": "yellow",
    "running": "cyan",
    "waiting": "blue",
    "exited": "green",
    "failed": "red",
    "killed": "red",
}


def _tree(rows: list[Row]) -> Tree:
    tree = Tree("[bold]agent:demo[/bold]")
    nodes: dict[str, Tree] = {}
    for row in rows:
        parent = nodes.get(row.lineage.rpartition("/")[0], tree)
        style = _STYLE.get(row.status, "white")
        name = rich_safe(row.lineage.rpartition("/")[2])
        label = f"{name} [{style}]{rich_safe(row.status)}[/{style}]  {rich_safe(row.burn)}"
        nodes[row.lineage] = parent.add(label)
    return tree


@click.command("demo")
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A new directory for the demo's Charter home (default: a fresh temporary one).",
)
@click.option("--shards", type=click.IntRange(1, 32), default=6, show_default=True)
@click.option(
    "--respect-host-load",
    is_flag=True,
    help="Let the host's load average throttle the cell (by default the demo leaves it "
    "out, so a busy machine slows the demo down instead of holding it at zero slots).",
)
@click.pass_obj
def demo(ctx: Ctx, home: Path | None, shards: int, respect_host_load: bool) -> None:
    """Run a real two-level fan-out over the Python standard library's sources: a
    coordinator shards them, reviewers look for risky calls, big shards fan out once
    more; each worker in its own sandbox under its own grant and lease. The live tree
    goes to stderr, the merged report to stdout, and the journal is verified at the end
    (exit 3 if it does not verify)."""
    home = home or Path(tempfile.mkdtemp(prefix="charter-demo-")) / "home"
    ctx.status(f"demo home: {home} (SQLite journal inside; CHARTER_HOME={home} to look)")
    console = Console(stderr=True)
    show = not ctx.quiet and console.is_terminal
    live = Live(console=console, auto_refresh=False) if show else None
    with live if live is not None else contextlib.nullcontext():
        outcome = run_demo(
            home,
            shards=shards,
            ignore_host_load=not respect_host_load,
            on_tick=(lambda rows: live.update(_tree(rows), refresh=True)) if live else None,
        )
    ctx.emit(_json(outcome), lambda: _text(outcome))
    if not outcome.verified.ok:
        ctx.status(f"the journal does NOT verify: {outcome.verified.reason}")
        sys.exit(3)
    ctx.status(f"journal verified: {outcome.verified.checked} entries")


def _json(outcome: DemoOutcome) -> dict[str, object]:
    return {
        "home": str(outcome.home),
        "journal": outcome.journal,
        "report": outcome.report,
        "totals": outcome.totals,
        "verified": outcome.verified.ok,
        "checked": outcome.verified.checked,
        "workers": [
            {"lineage": r.lineage, "status": r.status, "burn": r.burn} for r in outcome.rows
        ],
    }


def _text(outcome: DemoOutcome) -> None:
    """The report for people. It is the coordinator's answer (a worker's text): every
    part of it is shown through ``printable``."""
    report = outcome.report
    click.echo(printable(f"risky calls in {report['files']} files of the Python standard library:"))
    for pattern, count in report["counts"].items():
        click.echo(printable(f"  {pattern:<14} {count}"))
    for path, line, pattern in report["findings"]:
        click.echo(printable(f"{path}:{line}: {pattern}"))
    totals = outcome.totals
    click.echo(
        f"usage: {totals['workers']} workers, cpu {totals['cpu_ms'] / 1000:.2f}s, "
        f"wall {totals['wall_ms'] / 1000:.1f}s (summed), peak memory "
        f"{totals['memory_peak_bytes'] / 2**20:.1f} MiB, egress {totals['egress_bytes']} B"
    )
    click.echo(json.dumps({"verified": outcome.verified.ok, "checked": outcome.verified.checked}))
