"""The page's web face: a starlette app over one :class:`~charter.serve._fabric.Fabric`.

Routes (every one GET; any other method is refused with 405 before routing):

- ``/``: the page (``static/index.html``); ``/static/...``: its script and style;
- ``/api/head``: ``{"position": HEAD}``;
- ``/api/fabric[?as_of=POS]``: everything the page shows, with the ``position`` it
  reflects (the head, or POS);
- ``/api/stream[?after=POS]``: server-sent events (``id`` the position each reflects):
  a ``snapshot`` (the ``/api/fabric`` document) first, unless the client names a live
  position the server still holds the deltas from (``Last-Event-ID``, else ``after``);
  then a ``delta`` (:mod:`charter.serve._delta`) each time the follower has folded new
  commits.

Access (docs/serve.md, "Binding and the token"): with a token file, every request needs
the token: ``Authorization: Bearer TOKEN``, or the session cookie the page gets by
opening ``/?token=TOKEN`` once (an HttpOnly, SameSite=Strict cookie holding an HMAC of
the token, never the token: a new token ends every session). Without one (loopback
only), a request must name a loopback host in ``Host`` (no DNS rebinding).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from charter.core import BadInputError, CharterError
from charter.mcp import file_token_matches, read_token_file
from charter.serve._delta import diff
from charter.serve._fabric import Fabric

__all__ = ["COOKIE", "LOOPBACK_HOSTS", "build_app", "session_value"]

logger = logging.getLogger("charter.serve")
STATIC = Path(__file__).with_name("static")
COOKIE = "charter_serve"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
_POLL_S = 0.02  # how often the follower reads the journal head
_KEEPALIVE_S = 15.0
_RETAINED = 256  # deltas held for a client that reconnects behind the head
_SECURITY = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


def session_value(token: str) -> str:
    """What the session cookie holds for ``token``: an HMAC of it, never the token."""
    return hmac.new(token.encode(), b"charter-serve-session", hashlib.sha256).hexdigest()


def _host_of(header: str) -> str:
    host = header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class _Guard:
    """Refuses, before any route: a method other than GET or HEAD (405); without a
    token file, a request naming a host that is not loopback (421); with one, a request
    without the token or its session (401)."""

    def __init__(self, app: ASGIApp, token_file: Path | None) -> None:
        self.app = app
        self.token_file = token_file

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if request.method not in ("GET", "HEAD"):
            answer = _refusal(405, "read-only: only GET is served", {"allow": "GET, HEAD"})
            await answer(scope, receive, send)
            return
        if self.token_file is None:
            if _host_of(request.headers.get("host", "")) not in LOOPBACK_HOSTS:
                await _refusal(421, "not a loopback host")(scope, receive, send)
                return
        elif not self._allowed(request):
            await _refusal(401, "a token is needed", {"www-authenticate": "Bearer"})(
                scope, receive, send
            )
            return
        await self.app(scope, receive, send)

    def _allowed(self, request: Request) -> bool:
        assert self.token_file is not None
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and presented:
            return file_token_matches(self.token_file, presented.strip())
        if request.url.path == "/" and "token" in request.query_params:
            return file_token_matches(self.token_file, request.query_params["token"])
        cookie = request.cookies.get(COOKIE, "")
        current = read_token_file(self.token_file)
        if current is None or not cookie:
            return False
        return hmac.compare_digest(session_value(current).encode(), cookie.encode())


def _refusal(status: int, why: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": why}, status, headers={**_SECURITY, **(headers or {})})


class _Hub:
    """The newest live fabric, the deltas that led to it, and a wake-up for every
    stream waiting for a newer one."""

    def __init__(self) -> None:
        self.position = -1
        self.body = b""
        # (base, position, body) of the newest deltas, each based on the one before
        self.deltas: deque[tuple[int, int, bytes]] = deque(maxlen=_RETAINED)
        self.changed = asyncio.Condition()
        # names this process's fabrics in event ids: another process's fabric at the
        # same position may differ (its burn-down was sampled apart), so no delta of
        # ours applies to it
        self.tag = secrets.token_hex(4)

    async def publish(self, position: int, body: bytes, delta: bytes | None) -> None:
        """The live fabric at ``position`` (``body``), and the delta to it from the one
        published before (None: none expresses it; the chain starts again)."""
        async with self.changed:
            if delta is None:
                self.deltas.clear()
            else:
                self.deltas.append((self.position, position, delta))
            self.position, self.body = position, body
            self.changed.notify_all()

    async def newer(
        self, after: int, timeout: float, *, held: bool
    ) -> list[tuple[str, int, bytes]]:
        """What takes a client past ``after`` to the newest live fabric: the deltas
        since, when it holds this hub's fabric at ``after`` (``held``) and they are
        still here, else the snapshot. Empty if nothing newer came within ``timeout``."""
        async with self.changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: self.position > after), timeout
                )
            if self.position <= after:
                return []
            chain = list(self.deltas) if held else []
            for i, (base, _, _) in enumerate(chain):
                if base == after:
                    return [("delta", position, body) for _, position, body in chain[i:]]
            return [("snapshot", self.position, self.body)]


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def _position(text: str | None, name: str) -> int | None:
    if text is None or text == "":
        return None
    if not (text.isascii() and text.isdigit()):
        raise BadInputError(f"{name}={text!r} is not a journal position (a whole number >= 0)")
    return int(text)


def _guarded(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` with Charter's errors as JSON refusals (bad input 400, else 409)."""

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except CharterError as e:
            return _refusal(400 if isinstance(e, BadInputError) else 409, str(e))

    return answer


class _Page:
    """The handlers over one fabric, and the follower that keeps the hub live."""

    def __init__(self, fabric: Fabric, token_file: Path | None) -> None:
        self.fabric = fabric
        self.token_file = token_file
        self.hub = _Hub()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.wrap_future(self.fabric.submit(fn, *args))

    async def follow(self) -> None:
        """Fold each new commit and publish the live fabric and the delta to it from
        the one before, as soon as the head moves."""
        hub = self.hub
        last: dict[str, Any] | None = None
        while True:
            try:
                head = await self.run(self.fabric.head)
                if head != hub.position:
                    data = await self.run(self.fabric.fabric, None)
                    delta = None if last is None else diff(last, data)
                    await hub.publish(
                        int(data["position"]),
                        _dumps(data),
                        None if delta is None else _dumps(delta),
                    )
                    last = data
                    continue
            except CharterError as e:  # the database is away: say so, try again
                logger.warning("charter serve: reading the journal failed: %s", e)
                await asyncio.sleep(1.0)
            await asyncio.sleep(_POLL_S)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        del app
        task = asyncio.create_task(self.follow())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def page(self, request: Request) -> Response:
        if "token" in request.query_params:  # (the guard checked it) set the session
            current = read_token_file(self.token_file) if self.token_file is not None else None
            response: Response = Response(status_code=303, headers={"location": "/"})
            if current is not None:
                response.set_cookie(
                    COOKIE, session_value(current), httponly=True, samesite="strict", path="/"
                )
            return response
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    async def head(self, request: Request) -> Response:
        del request
        return JSONResponse({"position": await self.run(self.fabric.head)})

    async def snapshot(self, request: Request) -> Response:
        as_of = _position(request.query_params.get("as_of"), "as_of")
        if as_of is None and self.hub.position >= 0:
            body = self.hub.body
        else:
            body = _dumps(await self.run(self.fabric.fabric, as_of))
        return Response(body, media_type="application/json")

    async def stream(self, request: Request) -> Response:
        # the browser's reconnection names the last event it got: newer than any ?after=
        after, held = self._resume(
            request.headers.get("last-event-id") or request.query_params.get("after")
        )
        hub = self.hub

        async def events() -> AsyncIterator[bytes]:
            seen, known = after, held
            tag = hub.tag.encode()
            yield b"retry: 1000\n\n"
            while not await request.is_disconnected():
                found = await hub.newer(seen, _KEEPALIVE_S, held=known)
                if not found:
                    yield b": keep-alive\n\n"
                    continue
                for kind, seen, body in found:
                    yield b"id: %d@%s\nevent: %s\ndata: %s\n\n" % (seen, tag, kind.encode(), body)
                known = True

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"x-accel-buffering": "no"}
        )

    def _resume(self, text: str | None) -> tuple[int, bool]:
        """Where a stream starts: past the position named (``POS``, or an event id
        ``POS@TAG``; -1 when none), and whether the client holds this hub's fabric
        there (its tag is this hub's), so deltas from it apply."""
        position, _, tag = (text or "").partition("@")
        found = _position(position, "after")
        if found is None:
            return -1, False
        return found, tag == self.hub.tag

    async def icon(self, request: Request) -> Response:
        del request
        return Response(status_code=204)


def build_app(fabric: Fabric, *, token_file: Path | None = None) -> ASGIApp:
    """The page's app over ``fabric``; ``token_file``: require its token (docs/serve.md)."""
    handlers = _Page(fabric, token_file)
    routes = [
        Route("/", _guarded(handlers.page), methods=["GET"]),
        Route("/favicon.ico", handlers.icon, methods=["GET"]),
        Route("/api/head", _guarded(handlers.head), methods=["GET"]),
        Route("/api/fabric", _guarded(handlers.snapshot), methods=["GET"]),
        Route("/api/stream", _guarded(handlers.stream), methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=handlers.lifespan)
    return _Guard(_Headers(app), token_file)


class _Headers:
    """The security headers on every answer, the static files' included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                extra = [
                    (k.encode(), v.encode())
                    for k, v in _SECURITY.items()
                    if k.encode() not in names
                ]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, sending)
