"""``charter logs LINEAGE [-f]``: a worker's live stdout and stderr tail, from the
bounded files its cell keeps on this host (docs/cell.md, "Logs")."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import click

from charter.app import Charter
from charter.cli._common import Ctx
from charter.control import LIVE_STATUSES
from charter.core import StateError
from charter.core.text import shown
from charter.runner import STREAMS, log_dir
from charter.runner.status import WorkerWatch
from charter.sandbox import default_state_dir

__all__ = ["logs"]

_FOLLOW_S = 0.2  # how often -f looks for more


@click.command("logs")
@click.argument("lineage")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as it writes, until it ends.")
@click.option(
    "--stream",
    type=click.Choice(["both", *STREAMS]),
    default="both",
    show_default=True,
    help="Which of its outputs.",
)
@click.pass_obj
def logs(ctx: Ctx, lineage: str, follow: bool, stream: str) -> None:
    """A worker's stdout and stderr as its cell on this host keeps them (the newest
    256 KiB of each). What it wrote is escaped for the terminal (each line as one
    line, control characters shown as escapes); --json has the exact bytes (base64)
    beside the text. -f follows until the worker ends."""
    streams = STREAMS if stream == "both" else (stream,)
    directory = log_dir(default_state_dir(), lineage)
    with Charter.open(ctx.db, read_only=True) as charter:
        watch = WorkerWatch(charter.journal)
        state = watch.status(lineage)
        if state is None:
            raise StateError(
                f"no worker {shown(lineage)} was scheduled in this journal (`charter tree` "
                "lists them)"
            )
        if not directory.is_dir() and not (follow and state in LIVE_STATUSES):
            raise StateError(
                f"no logs of {shown(lineage)} on this host ({state}): its cell keeps them "
                "where it ran it, from its start"
            )
        read = dict.fromkeys(streams, 0)
        while follow and state in LIVE_STATUSES:
            _show(ctx, lineage, directory, read, whole_lines=True)
            time.sleep(_FOLLOW_S)
            state = watch.status(lineage)
        _show(ctx, lineage, directory, read, whole_lines=False)  # the rest, to its end


def _show(
    ctx: Ctx, lineage: str, directory: Path, read: dict[str, int], *, whole_lines: bool
) -> None:
    """Print what each stream holds past ``read`` (and move it on); with
    ``whole_lines``, only up to its last newline (the rest comes with the next look)."""
    for stream, seen in list(read.items()):
        path = directory / stream
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        start = 0 if len(data) < seen else seen  # cut to its tail meanwhile: from its start
        read[stream] = start
        new = data[start:]
        if whole_lines:
            new = new[: new.rfind(b"\n") + 1]
        if not new:
            continue
        read[stream] += len(new)
        text = new.decode("utf-8", errors="replace")
        if ctx.as_json:
            ctx.emit(
                {
                    "lineage": lineage,
                    "stream": stream,
                    "text": text,
                    "bytes_b64": base64.b64encode(new).decode("ascii"),
                },
                "",
            )
        else:
            prefix = "" if stream == "stdout" else "stderr: "
            for line in text.splitlines():
                click.echo(prefix + shown(line, limit=4096))
