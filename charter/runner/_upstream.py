"""The model door's client of the model endpoint: one kept-alive HTTP/1.1 connection,
a request written in one send, its answer read off the socket by this module.

``http.client`` cost the door about 0.2 ms of CPU a call (its header parsing goes
through ``email.parser``; docs/performance.md, "model, 2026-12-03"); the door sends
one shape of request and needs of the answer only its status, ``Content-Type``, its
framing and whether the connection may carry the next call. Read here: the status
line (1xx interim answers skipped), the header fields (no obsolete line folding), the
body by ``Transfer-Encoding: chunked`` (:class:`charter.runner._sse.Dechunker`),
``Content-Length``, or, without either, to the connection's end. Anything else the
server sends that is not HTTP/1.x raises :class:`UpstreamProtocolError`; a socket
that fails, ``OSError``.
"""

from __future__ import annotations

import re
import socket
import ssl
from collections.abc import Generator, Iterator, Mapping
from urllib.parse import SplitResult

from charter.runner._sse import READ, Dechunker

__all__ = ["MAX_HEAD", "Answer", "UpstreamConnection", "UpstreamProtocolError", "request_head"]

MAX_HEAD = 64 * 1024  # an answer's status line and header fields, at most
_MAX_FIELDS = 100  # header fields in one answer, at most (as http.client)
# Answers that have no body whatever their header fields say (RFC 9112 §6.3).
_NO_BODY = frozenset({204, 304})
# The blank line that ends a head (CRLF, or a bare LF as http.client also accepts).
_HEAD_END = re.compile(rb"\r?\n\r?\n")


class UpstreamProtocolError(ValueError):
    """The model server's answer is not HTTP/1.x as read here, or ended early."""


def request_head(url: SplitResult, path: str, headers: Mapping[str, str]) -> bytes:
    """The request's line and header fields but its length, for every call to ``path``
    at ``url`` (derived once): ``Host`` as http.client writes it, and
    ``Accept-Encoding: identity`` (without it any content coding is acceptable)."""
    host = url.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    default = 443 if url.scheme == "https" else 80
    if url.port is not None and url.port != default:
        host = f"{host}:{url.port}"
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


class UpstreamConnection:
    """One connection to the model endpoint, connected at its first request, kept
    for the next while each answer is read to its end (``reusable``)."""

    def __init__(self, url: SplitResult, timeout: float) -> None:
        self._url = url
        self._timeout = timeout
        self.sock: socket.socket | None = None
        self._buf = b""  # read past the last answer's head, not yet consumed
        self.reusable = False

    def connect(self) -> socket.socket:
        url = self._url
        host = url.hostname or ""
        port = url.port or (443 if url.scheme == "https" else 80)
        sock = socket.create_connection((host, port), self._timeout)
        try:
            # Each request goes at once (no Nagle stall behind a delayed ACK).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if url.scheme == "https":  # verified as http.client's default context does
                context = ssl.create_default_context()
                context.set_alpn_protocols(["http/1.1"])
                sock = context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        return sock

    def close(self) -> None:
        self.reusable = False
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def request(self, head: bytes, body: bytes) -> Answer:
        """Send one request (``head`` from :func:`request_head`) and read its answer's
        head; its body is read from the :class:`Answer`."""
        sock = self.sock if self.sock is not None else self.connect()
        self.reusable = False  # until this answer is read to its end
        sock.sendall(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
        while True:
            status, fields, keep = self._head(sock)
            if not 100 <= status < 200 or status == 101:
                return Answer(self, sock, status, fields, keep)

    def _head(self, sock: socket.socket) -> tuple[int, dict[str, str], bool]:
        """The next answer's status, header fields (names lower-cased; a repeated
        one's values joined by commas) and whether its connection stays open."""
        buf = self._buf
        start = 0
        while (end := _HEAD_END.search(buf, start)) is None:
            if len(buf) > MAX_HEAD:
                raise UpstreamProtocolError(f"an answer's head is over {MAX_HEAD} B")
            start = max(0, len(buf) - 3)
            more = sock.recv(READ)
            if not more:
                raise UpstreamProtocolError("the server closed the connection before answering")
            buf += more
        head, self._buf = buf[: end.start()], buf[end.end() :]
        lines = [line.removesuffix("\r") for line in head.decode("latin-1").split("\n")]
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if version not in ("HTTP/1.1", "HTTP/1.0") or not code.isdigit() or rest[3:4] not in (
            "", " ",
        ):  # fmt: skip
            raise UpstreamProtocolError(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
        if len(lines) > _MAX_FIELDS + 1:
            raise UpstreamProtocolError(f"an answer has over {_MAX_FIELDS} header fields")
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip() or line[0] in " \t":
                raise UpstreamProtocolError(f"a malformed header field: {line[:60]!r}")
            name, value = name.lower(), value.strip(" \t")
            fields[name] = f"{fields[name]}, {value}" if name in fields else value
        tokens = {t.strip().lower() for t in fields.get("connection", "").split(",")}
        keep = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
        return int(code), fields, keep


class Answer:
    """An answer whose head was read: its body read whole (:meth:`read`) or as it
    comes (:meth:`pieces`), once. ``done`` once the body was read to its end; the
    connection is then reusable unless the answer said otherwise."""

    def __init__(
        self,
        upstream: UpstreamConnection,
        sock: socket.socket,
        status: int,
        fields: dict[str, str],
        keep: bool,
    ) -> None:
        self.status = status
        self._fields = fields
        self._upstream, self._sock = upstream, sock
        self._keep = keep
        self.done = False
        self._chunks: Dechunker | None = None
        self._left: int | None = None  # bytes of a body with a length still to come
        coding = fields.get("transfer-encoding")
        if status in _NO_BODY:
            self._left = 0
        elif coding is not None:
            if coding.rsplit(",", 1)[-1].strip().lower() != "chunked":
                raise UpstreamProtocolError(f"a transfer coding not read here: {coding[:40]!r}")
            self._chunks = Dechunker()
        elif "content-length" in fields:
            length = fields["content-length"]
            if not length.isdigit():
                raise UpstreamProtocolError(f"a malformed Content-Length: {length[:40]!r}")
            self._left = int(length)
        else:  # delimited by the connection's end
            self._keep = False

    def header(self, name: str, default: str) -> str:
        return self._fields.get(name.lower(), default)

    def read(self, limit: int) -> bytes:
        """The body, at most ``limit`` bytes of it (``done`` when that was all)."""
        out: list[bytes] = []
        size = 0
        for piece in self.pieces():
            out.append(piece)
            size += len(piece)
            if size >= limit:
                break
        data = b"".join(out)
        if len(data) > limit:
            self.done = False
            return data[:limit]
        return data

    def pieces(self) -> Iterator[bytes]:
        """The body, each piece all that one read gave (never empty); read to its end,
        the answer is ``done`` and its connection reusable (unless it said close, or
        sent more than its body). A body cut short raises :class:`UpstreamProtocolError`;
        a malformed chunk, ``ValueError``."""
        upstream = self._upstream
        buf, upstream._buf = upstream._buf, b""
        if self._chunks is not None:
            extra = yield from self._chunked(buf, self._chunks)
        elif self._left is not None:
            extra = yield from self._sized(buf, self._left)
        else:
            extra = yield from self._to_the_end(buf)
        self.done = True
        # Bytes past the answer (none was asked for): the connection is not reused.
        upstream.reusable = self._keep and not extra

    def _chunked(self, buf: bytes, chunks: Dechunker) -> Generator[bytes, None, bool]:
        data = chunks.feed(buf) if buf else b""
        while True:
            if data:
                yield data
            if chunks.done:
                return chunks.extra
            more = self._sock.recv(READ)
            if not more:
                raise UpstreamProtocolError("a chunked answer ended early")
            data = chunks.feed(more)

    def _sized(self, buf: bytes, left: int) -> Generator[bytes, None, bool]:
        while True:
            piece, buf = buf[:left], buf[left:]
            left -= len(piece)
            if piece:
                yield piece
            if not left:
                return bool(buf)
            buf = self._sock.recv(READ)
            if not buf:
                raise UpstreamProtocolError(f"an answer ended {left} B short of its length")

    def _to_the_end(self, buf: bytes) -> Generator[bytes, None, bool]:
        while True:
            if buf:
                yield buf
            buf = self._sock.recv(READ)
            if not buf:
                return False
