"""The door's ``act``: a worker's outward-acting HTTP call, sent at most once per key.

The worker names the request (method, URL, headers, body) and an idempotency key; the
door journals the intent (pinned: one per key and lease,
:class:`charter.control.outward.OutwardCalls`), sends the request through the cell's
egress broker *as the worker's sandbox* (its grant's destinations, the address check,
``EgressOpened`` and any held secret bound to the destination, its egress byte budget:
:meth:`charter.sandbox.EgressBroker.send_as`), reads the answer, and journals the
outcome. A retry with the key gets the recorded outcome; nothing is sent twice
(docs/door.md, ``act``).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from charter.control.outward import (
    DESTINATION_CAP,
    DETAIL_CAP,
    OUTWARD_KEY_PATTERN,
    OutwardAnswer,
    OutwardCalls,
    OutwardNotSent,
    OutwardReply,
)
from charter.core import BadInputError
from charter.runner._journal_allowance import ENTRY_OVERHEAD
from charter.runner.events import RESULT_CAP
from charter.sandbox import DialRefusedError, EgressBroker

__all__ = [
    "MAX_REPLY",
    "REPLY_SHOWN",
    "ActParams",
    "Built",
    "act",
    "outward_bytes",
    "request_bytes",
]

MAX_REPLY = 1024 * 1024
"""Bytes of a destination's answer the door reads (and digests); the rest is not read."""
REPLY_SHOWN = RESULT_CAP
"""Bytes of the answer's body handed back to the worker (the digest covers all read)."""
MAX_HEADERS = 64
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_KEPT_BY_DOOR = frozenset(
    {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "upgrade", "te"}
)


class ActParams(BaseModel):
    """``act``'s params: the key and the request (docs/door.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(pattern=OUTWARD_KEY_PATTERN)
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str = Field(min_length=8, max_length=4096)
    headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_HEADERS)
    body: str = Field(default="", max_length=RESULT_CAP)


class Built:
    """A request as the door sends it: its bytes, destination and digest."""

    def __init__(self, raw: bytes, host: str, port: int, tls: bool) -> None:
        self.raw, self.host, self.port, self.tls = raw, host, port, tls
        bracketed = f"[{host}]" if ":" in host else host
        self.destination = f"{bracketed}:{port}"[:DESTINATION_CAP]
        self.digest = hashlib.sha256(raw).hexdigest()


def request_bytes(params: ActParams) -> Built:
    """The HTTP/1.1 request ``params`` name, as the door sends it (``Connection:
    close``, its length set by the door), or BadInputError."""
    parts = urlsplit(params.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInputError("url: http:// or https:// with a host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise BadInputError("url: the port is not a number in 1..65535") from e
    if parts.username or parts.password or parts.fragment:
        raise BadInputError("url: no user, password or fragment")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in target for c in " \r\n\t") or not target.isascii():
        raise BadInputError("url: its path and query are ASCII without spaces")
    host = parts.hostname
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"{params.method} {target} HTTP/1.1", f"Host: {authority}"]
    for name, value in params.headers.items():
        if not _TOKEN.fullmatch(name) or name.lower() in _KEPT_BY_DOOR:
            raise BadInputError(f"headers: {name[:64]!r} is no header a worker may set")
        if name.lower().startswith("proxy-") or any(c in value for c in "\r\n\0"):
            raise BadInputError(f"headers: {name[:64]!r} is no header a worker may set")
        lines.append(f"{name}: {value}")
    body = params.body.encode()
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as e:
        raise BadInputError("headers: values are Latin-1 text") from e
    return Built(head + body, host, port, parts.scheme == "https")


def outward_bytes(lineage: str, key: str, destination: str) -> int:
    """Journal bytes one ``act`` may write (its intent and outcome), charged to the
    worker's journal allowance before the intent: both payloads at their bounds plus
    an envelope each. The broker's ``EgressOpened`` is bounded as for every dial."""
    ids = 2 * (len(lineage.encode()) + len(key)) + len(destination.encode())
    return 2 * ENTRY_OVERHEAD + ids + DETAIL_CAP + 512


class _Bytes:
    """What :class:`http.client.HTTPResponse` reads from: bytes already in hand."""

    def __init__(self, data: bytes) -> None:
        self._file = io.BytesIO(data)

    def makefile(self, *_: Any, **__: Any) -> io.BytesIO:
        return self._file


def parse_reply(data: bytes, method: str) -> OutwardReply:
    """The status and body of an HTTP answer read whole (status 0, the bytes as body,
    when they are no HTTP answer: the destination answered, but not in HTTP)."""
    response = http.client.HTTPResponse(_Bytes(data), method=method)  # type: ignore[arg-type]
    try:
        response.begin()
        return OutwardReply(response.status, response.read())
    except (http.client.HTTPException, ValueError, OSError):
        return OutwardReply(0, data)


def act(
    calls: OutwardCalls,
    allowance: Any,
    broker: EgressBroker | None,
    uid: int,
    lineage: str,
    params: ActParams,
    built: Built,
) -> dict[str, object]:
    """Serve one ``act`` of the worker ``lineage`` (its sandbox on ``uid``; ``built``
    its request, :func:`request_bytes`): its journal bytes charged first, then sent at
    most once for its key (see the module docstring)."""
    with allowance.held(lineage):
        allowance.charge(lineage, outward_bytes(lineage, params.key, built.destination))

    def send() -> OutwardReply:
        if broker is None:
            raise OutwardNotSent("the cell has no egress broker")
        try:
            data = broker.send_as(uid, built.raw, tls=built.tls, limit=MAX_REPLY)
        except DialRefusedError as e:
            raise OutwardNotSent(f"refused by the egress broker: {e.code} {e.reason}") from e
        return parse_reply(data, params.method)

    answer: OutwardAnswer = calls.act(lineage, params.key, built.digest, built.destination, send)
    reply = answer.to_json()
    body = answer.body
    reply["body"] = None if body is None else body[:REPLY_SHOWN].decode("utf-8", "replace")
    reply["body_truncated"] = body is not None and len(body) > REPLY_SHOWN
    return reply
