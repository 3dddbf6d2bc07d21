"""What the egress broker reads from a sandbox before it connects anywhere: one HTTP/1.1
request head, parsed by h11 (a well-kept parser, not by hand), or a TLS ClientHello.

* ``CONNECT host:port`` / ``CONNECT [v6]:port`` (a tunnel; bytes the client sent right
  after the head are kept and forwarded once the tunnel opens);
* absolute-form ``GET http://host[:port]/...`` (forwarded in origin form, ``Proxy-*``
  headers dropped);
* origin-form ``GET /path`` with a ``Host`` header (forwarded as received);
* a TLS ClientHello, whose SNI names the destination (port 443; forwarded as received).

Anything else, including a head h11 refuses (a request line with non-ASCII bytes, an
HTTP/1.1 request without ``Host``), a port that is not 1-5 ASCII digits in 1..65535 and a
head longer than the limit, is malformed: the broker answers 400 and records it.
"""

from __future__ import annotations

import functools
import re
import socket
from typing import NamedTuple

import h11

__all__ = ["Head", "parse_head", "read_head", "response"]

_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)


class Head(NamedTuple):
    """A request's destination and what to do first: ``tunnel`` (CONNECT: answer 200,
    then send ``forward``) or send ``forward`` upstream as the start of the stream."""

    host: str
    port: int
    forward: bytes
    tunnel: bool


def read_head(conn: socket.socket, *, timeout: float, limit: int) -> Head | None:
    """Read until a whole request head (or TLS record) is in; None when the peer closes,
    sends more than ``limit`` bytes of head, sends something unparseable or sends
    nothing for ``timeout`` seconds."""
    conn.settimeout(timeout)
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=limit)
    data = b""
    try:
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return None
            data += chunk
            if data[:1] == b"\x16":  # a TLS handshake record: wait for the whole record
                if len(data) > limit + 5:
                    return None
                if len(data) >= 5 and len(data) >= 5 + int.from_bytes(data[3:5], "big"):
                    name = _sni(data)
                    return Head(name, 443, data, tunnel=False) if name else None
                continue
            parser.receive_data(chunk)
            event = parser.next_event()
            if event is h11.NEED_DATA:
                continue
            if not isinstance(event, h11.Request):
                return None
            rest = bytes(parser.trailing_data[0])
            return parse_request(event, data[: len(data) - len(rest)], rest)
    except (OSError, h11.RemoteProtocolError, UnicodeDecodeError):
        return None


def parse_request(request: h11.Request, raw: bytes, rest: bytes) -> Head | None:
    """The destination of an h11 request whose head was ``raw``, followed by ``rest``."""
    method = request.method.decode("ascii")
    target = request.target.decode("ascii")
    if method == "CONNECT":
        where = _authority(target, None)
        return Head(where[0], where[1], rest, tunnel=True) if where else None
    if target.startswith("/"):  # origin form: the Host header names the destination
        hosts = [v for k, v in request.headers if k == b"host"]
        where = _authority(hosts[0].decode("ascii"), 80) if len(hosts) == 1 else None
        return Head(where[0], where[1], raw + rest, tunnel=False) if where else None
    if target.startswith("http://"):
        authority, slash, path = target[len("http://") :].partition("/")
        where = _authority(authority, 80)
        if where is None:
            return None
        version = request.http_version.decode("ascii")
        lines = [f"{method} {slash}{path} HTTP/{version}".encode("ascii")]
        lines += [
            k + b": " + v
            for k, v in request.headers.raw_items()
            if not k.lower().startswith(b"proxy-")
        ]
        return Head(where[0], where[1], b"\r\n".join(lines) + b"\r\n\r\n" + rest, tunnel=False)
    return None


def parse_head(data: bytes) -> Head | None:
    """:func:`read_head` on bytes already in hand (a whole head, then anything after)."""
    if data[:1] == b"\x16":
        name = _sni(data)
        return Head(name, 443, data, tunnel=False) if name else None
    parser = h11.Connection(h11.SERVER)
    parser.receive_data(data)
    try:
        event = parser.next_event()
        if not isinstance(event, h11.Request):
            return None
        rest = bytes(parser.trailing_data[0])
        return parse_request(event, data[: len(data) - len(rest)], rest)
    except (h11.RemoteProtocolError, UnicodeDecodeError):
        return None


def _authority(text: str, default_port: int | None) -> tuple[str, int] | None:
    """``host:port``, ``[v6]:port`` or (with a default port) a bare host, as (host, port);
    an IPv6 host comes back without its brackets. None for anything else."""
    if text.startswith("["):
        inside, close, after = text[1:].partition("]")
        host, port = inside, after[1:] if after.startswith(":") else None
        if not close or (after and port is None):
            return None
    else:
        host, sep, port_text = text.rpartition(":")
        host, port = (host, port_text) if sep else (text, None)
        if ":" in host:  # an IPv6 address must be in brackets
            return None
    if port is None:
        if default_port is None:
            return None
        return (host, default_port) if host else None
    if not _PORT.fullmatch(port) or not 0 < int(port) <= 65535 or not host:
        return None
    return host, int(port)


def _sni(record: bytes) -> str | None:
    """The server name of a TLS ClientHello record, or None."""
    try:
        p = 5 + 4 + 2 + 32  # record header, handshake header, version, random
        if record[5] != 1:
            return None
        p += 1 + record[p]  # session id
        p += 2 + int.from_bytes(record[p : p + 2], "big")  # cipher suites
        p += 1 + record[p]  # compression methods
        end = p + 2 + int.from_bytes(record[p : p + 2], "big")
        p += 2
        while p + 4 <= end:
            kind, size = (
                int.from_bytes(record[p : p + 2], "big"),
                int.from_bytes(record[p + 2 : p + 4], "big"),
            )
            if kind == 0:  # server_name: list length, name type, name length, name
                name_len = int.from_bytes(record[p + 7 : p + 9], "big")
                return record[p + 9 : p + 9 + name_len].decode("ascii")
            p += 4 + size
    except (IndexError, UnicodeDecodeError):
        return None
    return None


@functools.lru_cache(maxsize=64)
def response(code: int, reason: str) -> bytes:
    """A complete HTTP response carrying ``reason``; the connection closes after it."""
    body = (reason + "\n").encode()
    head = f"HTTP/1.1 {code} {reason}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body
