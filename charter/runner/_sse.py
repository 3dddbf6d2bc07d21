"""A model server's streamed answer as it arrives: the chunked framing taken off the
pieces each read of the socket gives (charter/runner/_upstream.py reads them), and
those pieces cut into server-sent events, so the model door relays what came in one
write, not one per line or event."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

__all__ = ["READ", "Dechunker", "data_of", "event_batches", "split_events"]

READ = 65536  # bytes asked of the socket at a time
_MAX_LINE = 4096  # a chunk-size or trailer line the reader accepts
_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")  # a chunk's size, before any extension
# The end of an event: a line's end, then a blank line (LF or CRLF).
_EVENT_END = re.compile(rb"\n\r?\n")


class Dechunker:
    """HTTP/1.1 chunked transfer coding taken off, as the bytes come (RFC 9112 §7.1):
    :meth:`feed` gives the data decoded so far; ``done`` once the last chunk and its
    trailers (dropped) were read, ``extra`` whether bytes came after them."""

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0  # bytes of the current chunk's data still to come
        self._crlf = False  # the CRLF after a chunk's data is due
        self._last = False  # the last chunk came: its trailers are being read
        self.done = False
        self.extra = False

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        out: list[bytes] = []
        while not self.done and self._step(out):
            pass
        self.extra = self.done and bool(self._buf)
        return b"".join(out)

    def _step(self, out: list[bytes]) -> bool:
        """Decode one part (data, its CRLF, or a line); False when more bytes are needed."""
        buf = self._buf
        if self._left:
            take = buf[: self._left]
            if take:
                out.append(take)
            self._left -= len(take)
            self._buf = buf[len(take) :]
            self._crlf = not self._left
            return not self._left
        if self._crlf:
            if len(buf) < 2:
                return False
            if buf[:2] != b"\r\n":
                raise ValueError("a chunk's data is not followed by CRLF")
            self._buf, self._crlf = buf[2:], False
            return True
        end = buf.find(b"\n")
        if end < 0:
            if len(buf) > _MAX_LINE:
                raise ValueError("a chunk-size or trailer line is too long")
            return False
        line, self._buf = buf[:end].rstrip(b"\r"), buf[end + 1 :]
        if self._last:  # a trailer field (not relayed), or the blank line ending them
            self.done = not line
            return True
        size = line.split(b";", 1)[0].rstrip(b" \t")
        if _SIZE.fullmatch(size) is None:
            raise ValueError(f"a chunk's size line is malformed: {line[:40]!r}")
        self._left = int(size, 16)
        self._last = not self._left
        return True


def event_batches(pieces: Iterable[bytes]) -> Iterator[list[bytes]]:
    """The server-sent events of a body read in ``pieces``, in the batches the reads gave them (the
    whole events each read completed, each with its closing blank line); a last event
    the stream ended without that blank line comes alone, at the end."""
    rest = b""
    for piece in pieces:
        events, rest = split_events(rest + piece)
        if events:
            yield events
    if rest:
        yield [rest]


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """The whole events at the start of ``buf``, each with its closing blank line, and
    what is left (the start of the next)."""
    events: list[bytes] = []
    start = 0
    for end in _EVENT_END.finditer(buf):
        events.append(buf[start : end.end()])
        start = end.end()
    return events, buf[start:]


def data_of(event: bytes) -> bytes:
    """The JSON of an event's ``data:`` lines (empty for ``[DONE]`` and comments)."""
    data = b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
    return b"" if data == b"[DONE]" else data
