"""Serving the page with uvicorn on a socket this process binds."""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from charter.core import StateError
from charter.mcp import read_token_file
from charter.serve._app import LOOPBACK_HOSTS, build_app
from charter.serve._fabric import Fabric

__all__ = ["SERVE_TOKEN_FILE", "is_loopback", "serve"]

SERVE_TOKEN_FILE = "serve-token"  # noqa: S105 (a file name, not a secret)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    db: str | None,
    host: str,
    port: int,
    *,
    token_file: Path | None,
    announce: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> None:
    """Serve the page of the journal at ``db`` on ``host:port`` until interrupted. A
    bind that is not loopback needs ``token_file`` (and a usable token in it); with one,
    every request needs its token. ``announce`` is told the URL once it listens."""
    import uvicorn

    if token_file is None and not is_loopback(host):
        raise StateError(
            f"{host} is not a loopback address: anyone who reaches it could read the fabric; "
            "give --token-file (made by `charter serve token`)"
        )
    if token_file is not None and read_token_file(token_file) is None:
        raise StateError(
            f"no usable token in {token_file} (missing, empty, or readable by others): "
            "run `charter serve token` first"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=64)
    fabric = Fabric(db)
    try:
        app = build_app(fabric, token_file=token_file)
        bound = listener.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        announce(f"charter serve: http://{shown}:{bound}/" + ("?token=…" if token_file else ""))
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1
        )
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        fabric.close()
        listener.close()
