"""``charter mcp``: serve Charter's tools to an MCP client; ``charter mcp token``.

Who the client is comes from how it connects (docs/mcp.md, "Identity"):

- inside a worker's sandbox (its door at ``/run/charter/keys.sock``, or ``--door``):
  the worker, as its door identifies it; stdio only;
- over stdio outside a sandbox: the operator, as a durable agent of this home. The
  client started this process as its own OS user, which can read the home's custody
  keys: it is the operator already. Refused unless the home is private to that user;
- over HTTP: the operator only with the home's token (``charter mcp token``) as a
  bearer header; loopback unless ``--allow-remote``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import click

from charter.cli._common import Ctx, host_port

__all__ = ["mcp_group"]

_DOOR = "/run/charter/keys.sock"
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _private_home(home: Path) -> None:
    """The operator over stdio is whoever may read this home: refuse one that others may."""
    from charter.core import StateError

    try:
        info = home.stat()
    except OSError as e:
        raise StateError(
            f"no Charter home at {home} ({e.strerror}): `charter init` makes one"
        ) from e
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise StateError(
            f"the Charter home {home} is not private to this user (owner uid {info.st_uid}, "
            f"mode {stat.S_IMODE(info.st_mode):o}): `chmod 700` it; a client of `charter mcp` "
            "acts as the operator only from a home no one else can read"
        )


def _worker(value: str | None) -> object:
    if value is None:
        return None
    from charter.cli._common import json_option
    from charter.control import WorkerSpec

    return json_option(WorkerSpec, value, "a worker")


def _agent(charter: object, given: str | None) -> str:
    from charter.app import Charter

    assert isinstance(charter, Charter)
    if given is not None:
        return given
    names = [r.lineage.root_name for r in charter.agents()]
    if len(names) != 1:
        listed = ", ".join(names) or "none"
        raise click.UsageError(f"name the agent to act as with --agent (agents: {listed})")
    return names[0]


@click.group("mcp", invoke_without_command=True)
@click.option(
    "--http",
    "http",
    default=None,
    metavar="HOST:PORT",
    help="Serve streamable HTTP at http://HOST:PORT/mcp (bearer token required); default: stdio.",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Let --http bind a non-loopback address (put TLS in front of it).",
)
@click.option("--agent", default=None, metavar="NAME", help="The durable agent to act as.")
@click.option(
    "--worker",
    "worker",
    default=None,
    metavar="JSON|@FILE",
    help='What each spawned child runs, like {"argv": ["/usr/bin/python3", "w.py"]} '
    "(default: children are minted and leased only).",
)
@click.option(
    "--door",
    "door",
    default=None,
    metavar="PATH",
    help=f"Serve as the worker whose door this is (default: {_DOOR} when it exists).",
)
@click.pass_context
def mcp_group(
    click_ctx: click.Context,
    http: str | None,
    allow_remote: bool,
    agent: str | None,
    worker: str | None,
    door: str | None,
) -> None:
    """Serve Charter's tools (spawn, wait, budget, subtree, revoke, whoami) to an MCP
    client over stdio, or over streamable HTTP with --http.

    The client's identity comes from the connection, never from a tool's arguments:
    inside a sandbox the worker (its door), over stdio the operator of this home, over
    HTTP the operator only with the token of `charter mcp token`.
    """
    if click_ctx.invoked_subcommand is not None:
        return
    ctx: Ctx = click_ctx.obj
    spec = _worker(worker)
    door_path = door or (_DOOR if Path(_DOOR).exists() else None)
    try:
        from charter.mcp.server import build_server, serve_http, serve_stdio
    except ImportError as e:
        raise click.ClickException(
            f"charter mcp needs the MCP SDK ({e.name} is missing): pip install 'charter[mcp]'"
        ) from e
    from charter.control import WorkerSpec
    from charter.mcp import DoorFace, OperatorFace

    assert spec is None or isinstance(spec, WorkerSpec)
    if door_path is not None:
        if http is not None or agent is not None:
            raise click.UsageError(
                "inside a sandbox the client is the worker: stdio only, no --http or --agent"
            )
        ctx.status(f"charter mcp: serving the worker of {door_path} on stdio")
        serve_stdio(build_server(DoorFace(door_path, spec)))
        return
    address = host_port(http) if http is not None else None
    if address is not None and address[0] not in _LOOPBACK and not allow_remote:
        raise click.UsageError(
            f"--http {http} is not a loopback address: anyone who reaches it may try "
            "tokens; give --allow-remote (and TLS in front) to mean it"
        )
    from charter.core import KeyStore, charter_home
    from charter.mcp import require_token

    home = KeyStore(charter_home()).home
    if address is None:
        _private_home(home)
    else:
        require_token(home)
    with contextlib.ExitStack() as stack:
        charter = stack.enter_context(ctx.open_charter())
        face = OperatorFace(charter, _agent(charter, agent), spec)
        stack.callback(face.close)

        def head() -> int:
            found = charter.journal.head()
            return found[0] if found else 0

        if address is None:
            ctx.status(f"charter mcp: serving {face.lineage} on stdio")
            serve_stdio(build_server(face, head=head))
        else:
            server = build_server(face, require_user=True, head=head)
            serve_http(server, home, *address)


@mcp_group.command("token")
@click.pass_obj
def token(ctx: Ctx) -> None:
    """Write a new operator token into the home (0600), replacing the old one at once,
    and print it: an HTTP client sends it as `Authorization: Bearer TOKEN`."""
    from charter.core import KeyStore, charter_home
    from charter.mcp import issue_token, token_path

    home = KeyStore(charter_home()).home
    value = issue_token(home)
    ctx.status(f"wrote {token_path(home)} (0600); the previous token no longer works")
    ctx.emit({"token": value, "path": str(token_path(home))}, value)
