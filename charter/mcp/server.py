"""The MCP server: Charter's tools on the official ``mcp`` SDK's low-level server
(so each tool's input schema is exactly the one declared here: the spawn tool's is
``charter spawn-schema``'s), over stdio or streamable HTTP.

Identity is the server's :class:`~charter.mcp.Face`, fixed at start: the operator
(an agent of the home) or the worker (its door). Over HTTP a request is served only
with the operator's bearer token (:mod:`charter.mcp._token`), checked by the SDK's
bearer middleware before the MCP layer sees anything; a tool handler checks again
that its request carries the authenticated user, and refuses otherwise.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from charter.authority import SpawnIntent, spawn_tool_definition
from charter.core import BadInputError, CharterError, RefusedError
from charter.mcp._faces import (
    MAX_WAIT_S,
    Face,
    NoParams,
    RevokeParams,
    WaitParams,
    parse,
)
from charter.mcp._token import token_matches
from charter.mcp.errors import NoIdentityError
from charter.runner.client import DoorError

__all__ = ["TOOLS", "build_server", "serve_http", "serve_stdio", "tool_list"]

_RO = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)


def _schema(model: type[Any]) -> dict[str, Any]:
    schema: dict[str, Any] = model.model_json_schema()
    schema.pop("title", None)
    schema["additionalProperties"] = False
    return schema


def tool_list() -> list[types.Tool]:
    """The tools, each with its input schema (the spawn tool's: the intent's, exactly)."""
    spawn = spawn_tool_definition()
    return [
        types.Tool(
            name="spawn",
            description=spawn["description"]
            + " Returns the fan-out, its children's lineages and the journal position.",
            input_schema=spawn["input_schema"],
            annotations=types.ToolAnnotations(destructive_hint=False, open_world_hint=False),
        ),
        types.Tool(
            name="wait",
            description=(
                "Wait for children this caller spawned, at most timeout_s (<= "
                f"{MAX_WAIT_S:g} s) per call: returns each ended child's status and result "
                "('done'), the others' status ('pending'), and a cursor; call again with the "
                "cursor until 'complete'."
            ),
            input_schema=_schema(WaitParams),
            annotations=_RO,
        ),
        types.Tool(
            name="budget",
            description="The caller's own budget ledger and those below it (a projection).",
            input_schema=_schema(NoParams),
            annotations=_RO,
        ),
        types.Tool(
            name="subtree",
            description="The caller's lineage subtree with each node's status (a projection).",
            input_schema=_schema(NoParams),
            annotations=_RO,
        ),
        types.Tool(
            name="revoke",
            description=(
                "Revoke one of the caller's own descendants and its whole subtree; the cell "
                "kills what of it runs."
            ),
            input_schema=_schema(RevokeParams),
            annotations=types.ToolAnnotations(destructive_hint=True, open_world_hint=False),
        ),
        types.Tool(
            name="whoami",
            description="Who this connection is: the caller's lineage, as Charter knows it.",
            input_schema=_schema(NoParams),
            annotations=_RO,
        ),
    ]


TOOLS = tuple(t.name for t in tool_list())
_NO_KEEP: frozenset[str] = frozenset()


def _handlers(face: Face) -> dict[str, Callable[[dict[str, Any] | None], dict[str, Any]]]:
    return {
        "spawn": lambda a: face.spawn(parse(SpawnIntent, a, keep=_NO_KEEP)),
        "wait": lambda a: face.wait(parse(WaitParams, a, keep=_NO_KEEP)),
        "budget": lambda a: (parse(NoParams, a, keep=_NO_KEEP), face.budget())[1],
        "subtree": lambda a: (parse(NoParams, a, keep=_NO_KEEP), face.subtree())[1],
        "revoke": lambda a: face.revoke(parse(RevokeParams, a, keep=frozenset({"lineage"}))),
        "whoami": lambda a: (parse(NoParams, a, keep=_NO_KEEP), face.whoami())[1],
    }


def _result(body: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    text = json.dumps(body, sort_keys=True, default=str)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=body,
        is_error=error,
    )


def _refusal(e: Exception, position: int | None) -> dict[str, Any]:
    if isinstance(e, DoorError):
        reason = (e.data or {}).get("reason") if isinstance(e.data, dict) else None
        return {"refused": True, "reason": reason or "door", "message": e.message,
                "position": position}  # fmt: skip
    reason = e.reason if isinstance(e, RefusedError) else "bad-input"
    return {"refused": True, "reason": reason, "error": type(e).__name__, "message": str(e),
            "position": position}  # fmt: skip


def build_server(
    face: Face, *, require_user: bool = False, head: Callable[[], int | None] = lambda: None
) -> Server[Any]:
    """The low-level SDK server for ``face``. ``require_user``: every tool call must
    carry the HTTP request the bearer middleware authenticated (HTTP), else it is
    refused. ``head``: the journal position a refusal is reported at."""
    handlers = _handlers(face)

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        del params
        if require_user and not _authenticated(ctx):
            return types.ListToolsResult(tools=[])
        return types.ListToolsResult(tools=tool_list())

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        handler = handlers.get(params.name)
        try:
            if require_user and not _authenticated(ctx):
                raise NoIdentityError("this connection presented no operator token")
            if handler is None:
                raise BadInputError(f"no tool {params.name[:64]!r}; tools: {', '.join(TOOLS)}")
            body = await anyio.to_thread.run_sync(handler, params.arguments)
        except (CharterError, DoorError) as e:
            at = await anyio.to_thread.run_sync(head)
            return _result(_refusal(e, at), error=True)
        return _result(body)

    return Server(
        "charter",
        version=_version(),
        instructions=(
            "Charter: fan out workers with `spawn` (an intent only: who you are comes from "
            "this connection), `wait` for them in bounded polls, read your `budget` and "
            "`subtree`, `revoke` your own descendants. Every result carries `position`."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _authenticated(ctx: ServerRequestContext[Any]) -> bool:
    scope = getattr(ctx.request, "scope", None)
    return isinstance(scope, dict) and isinstance(scope.get("user"), AuthenticatedUser)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("charter")
    except PackageNotFoundError:
        return "0"


def serve_stdio(server: Server[Any]) -> None:
    """Serve one client over this process's stdin and stdout until it closes them."""

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


class _OperatorToken:
    """The SDK's token verifier for the home's operator token."""

    def __init__(self, home: Path) -> None:
        self.home = home

    async def verify_token(self, token: str) -> AccessToken | None:
        if not token_matches(self.home, token):
            return None
        return AccessToken(token="", client_id="operator", scopes=["charter"])


def serve_http(
    server: Server[Any],
    home: Path,
    host: str,
    port: int,
    *,
    announce: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> None:
    """Serve streamable HTTP at ``http://HOST:PORT/mcp``, every request needing the
    operator token of ``home`` as a bearer header; ``announce`` is told the URL once
    the socket listens (port 0 picks a free one)."""
    import uvicorn

    url = f"http://{host}:{port}"
    app = server.streamable_http_app(
        host=host,
        auth=AuthSettings(issuer_url=url, resource_server_url=None),
        token_verifier=_OperatorToken(home),
    )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # A streamed reply is several small writes: without this, each kept-alive request
    # waited out the client's delayed ACK (~40 ms). Accepted sockets inherit it.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    announce(f"charter mcp: serving http://{shown}:{bound}/mcp")
    uvicorn.Server(config).run(sockets=[sock])
