"""``charter model configure|show``: the one place the operator names the model endpoint
every cell's model door forwards to, and the API key Charter holds for it
(docs/model-door.md)."""

from __future__ import annotations

from pathlib import Path

import click

from charter.cli._common import Ctx
from charter.core import charter_home
from charter.runner.model import configure_endpoint, load_endpoint

__all__ = ["model_group"]


@click.group("model")
def model_group() -> None:
    """The model endpoint workers reach through their model door."""


@model_group.command("configure")
@click.option("--url", required=True, help="The endpoint's base URL (…/v1).")
@click.option(
    "--key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A file holding the API key (copied into the home, mode 0600; never shown).",
)
@click.pass_obj
def configure(ctx: Ctx, url: str, key_file: Path | None) -> None:
    """Forward every worker's model calls to URL, with the key in FILE (cells started
    after this read it)."""
    path = configure_endpoint(charter_home(), url, key_file)
    data = {"url": url, "key": key_file is not None, "path": str(path)}
    held = "with a held API key" if key_file is not None else "without an API key"
    ctx.emit(data, f"model endpoint {url} ({held}), kept in {path}")


@model_group.command("show")
@click.pass_obj
def show(ctx: Ctx) -> None:
    """The configured endpoint (the key is never shown: only whether one is held)."""
    endpoint = load_endpoint(charter_home())
    if endpoint is None:
        ctx.emit({"url": None, "key": False}, "no model endpoint configured")
        return
    held = endpoint.api_key is not None
    ctx.emit(
        {"url": endpoint.url, "key": held},
        f"{endpoint.url} ({'an API key is held' if held else 'no API key'})",
    )
