"""``charter serve``: the operator's read-only page of the fabric; ``charter serve token``.

Loopback (127.0.0.1:8766) by default, open to this machine's users without a token;
any other address needs a token (``--token-file``, default the home's ``serve-token``,
written by ``charter serve token``). See docs/serve.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from charter.cli._common import Ctx, host_port

__all__ = ["serve_group"]

_DEFAULT_BIND = "127.0.0.1:8766"
FC = TypeVar("FC", bound=Callable[..., Any])


def _home_token_file() -> Path:
    from charter.core import KeyStore, charter_home
    from charter.serve import SERVE_TOKEN_FILE

    return KeyStore(charter_home()).home / SERVE_TOKEN_FILE


def _token_file(help_text: str) -> Callable[[FC], FC]:
    return click.option(
        "--token-file",
        "token_file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        metavar="FILE",
        help=help_text,
    )


@click.group("serve", invoke_without_command=True)
@click.option(
    "--bind",
    "bind",
    default=_DEFAULT_BIND,
    show_default=True,
    metavar="HOST:PORT",
    help="Where to listen (port 0 picks a free one); not loopback: a token is needed.",
)
@_token_file(
    "Require this file's token on every request (default on a non-loopback bind: the "
    "home's serve-token)."
)
@click.pass_context
def serve_group(click_ctx: click.Context, bind: str, token_file: Path | None) -> None:
    """Serve the read-only operator page: the live lineage tree, budgets with their
    burn-down, slot occupancy, the cells' liveness, recent refusals and verdicts, and
    an as-of slider over journal positions (server-sent events; nothing to build)."""
    if click_ctx.invoked_subcommand is not None:
        return
    ctx: Ctx = click_ctx.obj
    host, port = host_port(bind)
    try:
        from charter.serve import is_loopback, serve
    except ImportError as e:
        raise click.ClickException(
            f"charter serve needs starlette and uvicorn ({e.name} is missing): "
            "pip install 'charter[serve]'"
        ) from e
    if token_file is None and not is_loopback(host):
        token_file = _home_token_file()
    ctx.refuse_missing_journal()
    serve(ctx.db, host, port, token_file=token_file)


@serve_group.command("token")
@_token_file("Write it here (default: the home's serve-token).")
@click.pass_obj
def token(ctx: Ctx, token_file: Path | None) -> None:
    """Write a new page token (0600), replacing the old one at once (its sessions end),
    and print it: open the page once as /?token=TOKEN, or send `Authorization: Bearer`."""
    from charter.mcp import issue_token_file

    target = token_file or _home_token_file()
    value = issue_token_file(target)
    ctx.status(f"wrote {target} (0600); the previous token and its sessions no longer work")
    ctx.emit({"token": value, "path": str(target)}, value)
