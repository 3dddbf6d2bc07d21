"""The egress broker: the only way out of a sandbox is this unix socket.

Programs inside reach it as an HTTP(S) proxy on that socket. It accepts:

* ``CONNECT host:port`` (a proxy tunnel, for any TLS client that can use a unix socket);
* absolute-form ``GET http://host/...`` (a forward proxy request);
* origin-form ``GET /path`` with a ``Host`` header, and a raw TLS ClientHello, whose SNI
  names the destination (port 443). These two are what ``curl --unix-socket
  $CHARTER_EGRESS_SOCKET http://host/`` and ``https://host/`` send.

The broker identifies the sandbox by the peer's host uid
(``SO_PEERCRED``: unique per live sandbox, so no token can be stolen), checks the
destination against the grant (:func:`charter.core.destination.admits`: the grant's own
vocabulary), counts bytes in both directions against the egress byte budget, and records
every attempt, allowed or denied.

Attempts are recorded in aggregate, so a sandbox cannot grow the control plane's memory
(or the journal written at its exit) by flooding the broker: one record per
(destination, allowed, reason) with a count (and the bytes of its allowed connections
summed), destinations cut to ``_DESTINATION_KEPT`` characters, at most
``_MAX_RECORDS`` distinct records per sandbox, and every attempt beyond those counted in
one overflow record (destination ``(other)``, reason ``over the record cap``). A sandbox
therefore journals at most ``_MAX_RECORDS + 1`` EgressAttempted entries, whatever it does.

Every admitted connection holds one broker thread in the control plane, outside the
sandbox's cgroup, so admission happens on the accepting thread before any thread exists
(:class:`~charter.sandbox._peer.PeerServer`, shared with the key broker): a peer uid
with no registration is answered 403 and closed (its attempt is kept in
``unknown_attempts`` without a destination: nothing is read from it), and a registered
uid already holding ``_MAX_CONNECTIONS_PER_UID`` connections is answered 429 and closed.
A connection that sends no request head within ``_HEAD_TIMEOUT``, or whose tunnel moves
no byte either way for ``_IDLE_TIMEOUT``, is closed and gives its slot back.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections import deque
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from charter.core.destination import Destination, admits
from charter.sandbox._peer import PeerServer, Refusal
from charter.sandbox.events import EgressAttempted

__all__ = ["EgressBroker", "EgressGrant", "EgressTally"]

_HEAD_LIMIT = 8192
_CONNECT_TIMEOUT = 10.0  # seconds to reach the destination
_HEAD_TIMEOUT = 10.0  # seconds a peer may take to send its request head
# Seconds a tunnel may move no byte in either direction (and a send may stall) before it
# is closed. Generous on purpose: a model API may think for minutes before its first byte.
_IDLE_TIMEOUT = 300.0
# Concurrent connections per sandbox (peer uid). Each one holds a broker thread and two
# descriptors in the control plane, outside the sandbox's cgroup, for as long as the
# sandbox keeps it open; uncapped, that is the sandbox's pids cap × its nofile limit.
# 16 covers a worker's parallel fetches (browsers keep 6 per host, package managers a
# handful more) and bounds a sandbox's share of the control plane at 16 threads.
_MAX_CONNECTIONS_PER_UID = 16
_UNKNOWN_KEPT = 256  # unknown-peer attempts remembered (any host user can connect)
# Distinct (destination, allowed, reason) records kept per sandbox; attempts beyond them
# are counted in one overflow record. Generous for a worker's real destinations.
_MAX_RECORDS = 64
_DESTINATION_KEPT = 255  # characters of a destination kept in its record (a DNS name's max)
OVERFLOW_DESTINATION = "(other)"
OVERFLOW_REASON = "over the record cap"


class EgressGrant(BaseModel):
    """Where a sandbox may connect, and optionally a byte cap lower than its budget's
    (``None``: the budget's egress bytes are the cap).

    Destinations are written in the one egress vocabulary of
    :mod:`charter.core.destination` (``api.example.com``, ``*.example.com``, either with
    an optional ``:port``), the same language a worker's grant speaks, so what the grant
    admits is exactly what the broker lets through. A malformed entry is refused here,
    when the grant is made, not silently matched against nothing later.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    destinations: tuple[Destination, ...] = ()
    byte_budget: int | None = Field(ge=0, default=None)

    def byte_cap(self, budget_bytes: int) -> int:
        """The bytes the broker enforces for a sandbox whose spec allows ``budget_bytes``."""
        return budget_bytes if self.byte_budget is None else min(self.byte_budget, budget_bytes)

    def allows(self, host: str, port: int) -> bool:
        """True when some destination admits ``host:port`` (see :func:`admits`)."""
        return any(admits(entry, host, port) for entry in self.destinations)


class EgressTally(NamedTuple):
    """What a sandbox did through the broker, returned when it is unregistered."""

    attempts: tuple[EgressAttempted, ...] = ()
    used: int = 0


class _Record:
    """The running totals of one (destination, allowed, reason) record."""

    __slots__ = ("bytes_in", "bytes_out", "count")

    def __init__(self) -> None:
        self.count = 0
        self.bytes_out = 0
        self.bytes_in = 0


_Key = tuple[str, bool, str]  # destination, allowed, reason


class _Registration:
    def __init__(self, sandbox_id: str, grant: EgressGrant, byte_cap: int) -> None:
        self.sandbox_id = sandbox_id
        self.grant = grant
        self.cap = byte_cap
        self.used = 0
        # At most _MAX_RECORDS, in the order first seen; the rest go to ``overflow``.
        self.records: dict[_Key, _Record] = {}
        self.overflow = _Record()
        self.conns: set[socket.socket] = set()  # every admitted connection, until it ends

    def add(self, dest: str, allowed: bool, reason: str, out: int, inn: int) -> None:
        """Count one attempt into its record (or the overflow); the caller holds the lock."""
        key = (dest[:_DESTINATION_KEPT], allowed, reason)
        record = self.records.get(key)
        if record is None:
            if len(self.records) < _MAX_RECORDS:
                record = self.records[key] = _Record()
            else:
                record = self.overflow
        record.count += 1
        record.bytes_out += out
        record.bytes_in += inn

    def events(self, uid: int) -> list[EgressAttempted]:
        """The records as events (the caller holds the lock): at most _MAX_RECORDS + 1."""
        keyed = list(self.records.items())
        if self.overflow.count:
            keyed.append(((OVERFLOW_DESTINATION, False, OVERFLOW_REASON), self.overflow))
        events = []
        for (dest, allowed, reason), r in keyed:
            events.append(EgressAttempted(
                sandbox_id=self.sandbox_id, host_uid=uid, destination=dest, allowed=allowed,
                reason=reason, count=r.count, bytes_out=r.bytes_out, bytes_in=r.bytes_in,
            ))  # fmt: skip
        return events


class EgressBroker:
    """A threaded HTTP-proxy server on a unix socket, bound into every sandbox."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._regs: dict[int, _Registration] = {}
        # (uid, "?") per refused unknown peer: it is refused before a byte is read.
        self.unknown_attempts: deque[tuple[int, str]] = deque(maxlen=_UNKNOWN_KEPT)
        self._server = PeerServer(
            path, name="egress", max_per_uid=_MAX_CONNECTIONS_PER_UID, backlog=64,
            knows=self._knows, handler=self._serve, refusal=self._refusal,
        )  # fmt: skip

    # registration -----------------------------------------------------------------
    def register(
        self, host_uid: int, sandbox_id: str, grant: EgressGrant, *, byte_cap: int
    ) -> None:
        """Admit the sandbox running as ``host_uid``: ``grant``'s destinations, at most
        ``byte_cap`` bytes in both directions together (see :meth:`EgressGrant.byte_cap`)."""
        with self._lock:
            self._regs[host_uid] = _Registration(sandbox_id, grant, byte_cap)

    def unregister(self, host_uid: int) -> EgressTally:
        """Forget a sandbox, cut its open connections (their threads then end) and return
        its recorded attempts and the bytes it moved."""
        with self._lock:
            reg = self._regs.pop(host_uid, None)
            if reg is None:
                return EgressTally()
            # Under the lock: a connection leaves ``conns`` before it is closed, so no
            # shutdown here can reach a closed (and perhaps reused) descriptor.
            for conn in reg.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            return EgressTally(tuple(reg.events(host_uid)), reg.used)

    def used(self, host_uid: int) -> int:
        with self._lock:
            reg = self._regs.get(host_uid)
            return reg.used if reg else 0

    def attempts(self, host_uid: int) -> list[EgressAttempted]:
        with self._lock:
            reg = self._regs.get(host_uid)
            return reg.events(host_uid) if reg else []

    def active(self, host_uid: int) -> int:
        """Connections from ``host_uid`` that hold a broker thread now."""
        return self._server.active(host_uid)

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> EgressBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # admission (on the accepting thread) ---------------------------------------------
    def _knows(self, uid: int) -> bool:
        with self._lock:
            return uid in self._regs

    def _refusal(self, uid: int, why: Refusal) -> bytes:
        """The answer to a peer refused on accept, recorded where it is worth keeping."""
        if why == "unknown":
            with self._lock:
                self.unknown_attempts.append((uid, "?"))
            return _response(403, "unknown sandbox")
        if why == "busy":
            return _response(503, "broker busy")
        with self._lock:
            reg = self._regs.get(uid)
        if reg is not None:  # counted into one record, however many there are
            self._record(uid, reg, "?", False, "too many concurrent connections")
        return _response(429, "too many connections")

    # serving ------------------------------------------------------------------------
    def _record(self, uid: int, reg: _Registration, dest: str, allowed: bool, reason: str,
                *, out: int = 0, inn: int = 0) -> None:  # fmt: skip
        with self._lock:
            reg.add(dest, allowed, reason, out, inn)

    def _serve(self, conn: socket.socket, uid: int) -> None:
        """One admitted connection, on its own thread (the server closes it after)."""
        with self._lock:
            # Registered when admitted; if it has been unregistered since, there is
            # nothing to serve. Joining ``conns`` under the lock lets unregister cut it.
            reg = self._regs.get(uid)
            if reg is None:
                return
            reg.conns.add(conn)
        try:
            self._proxy(conn, uid, reg)
        except OSError:  # the peer went away (or was cut by unregister) mid-exchange
            pass
        finally:
            with self._lock:
                reg.conns.discard(conn)

    def _proxy(self, conn: socket.socket, uid: int, reg: _Registration) -> None:
        head = _read_head(conn)
        parsed = _parse_head(head) if head is not None else None
        dest = f"{parsed[0]}:{parsed[1]}" if parsed else "?"
        conn.settimeout(_IDLE_TIMEOUT)  # no send to this peer may stall forever
        if parsed is None:
            self._record(uid, reg, dest, False, "malformed proxy request")
            _reply(conn, 400, "malformed proxy request")
            return
        host, port, forward = parsed
        if not reg.grant.allows(host, port):
            self._record(uid, reg, dest, False, "destination not in the grant")
            _reply(conn, 403, "destination not in the grant")
            return
        if reg.used >= reg.cap:
            self._record(uid, reg, dest, False, "egress byte budget exhausted")
            _reply(conn, 403, "egress byte budget exhausted")
            return
        try:
            upstream = socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT)
        except OSError as e:
            self._record(uid, reg, dest, False, f"cannot connect: {e.strerror or e}")
            _reply(conn, 502, "cannot connect")
            return
        with upstream:
            upstream.settimeout(_IDLE_TIMEOUT)
            if forward is None:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            elif self._charge(reg, len(forward)) < len(forward):
                self._record(uid, reg, dest, False, "egress byte budget exhausted")
                return
            else:
                upstream.sendall(forward)
            out, inn, reason = self._relay(conn, upstream, reg, len(forward or b""))
        cut = reason == "egress byte budget exhausted"
        self._record(uid, reg, dest, not cut, reason, out=out, inn=inn)

    def _relay(self, conn: socket.socket, upstream: socket.socket, reg: _Registration,
               already: int) -> tuple[int, int, str]:  # fmt: skip
        """Copy both ways until either side closes, both sit idle for ``_IDLE_TIMEOUT``
        or the byte budget is spent; returns bytes out, bytes in and why it ended."""
        counts = {conn: already, upstream: 0}  # ``already`` was charged by the caller
        peer = {conn: upstream, upstream: conn}
        with selectors.DefaultSelector() as sel:
            sel.register(conn, selectors.EVENT_READ)
            sel.register(upstream, selectors.EVENT_READ)
            while True:
                ready = sel.select(timeout=_IDLE_TIMEOUT)
                if not ready:
                    return counts[conn], counts[upstream], "idle timeout"
                for key, _ in ready:
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = src.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        return counts[conn], counts[upstream], "closed"
                    allowed = self._charge(reg, len(data))
                    if allowed < len(data):
                        with contextlib.suppress(OSError):
                            peer[src].sendall(data[:allowed])
                        counts[src] += allowed
                        return counts[conn], counts[upstream], "egress byte budget exhausted"
                    counts[src] += len(data)
                    try:
                        peer[src].sendall(data)
                    except OSError:  # the reader went away or stalled for _IDLE_TIMEOUT
                        return counts[conn], counts[upstream], "closed"

    def _charge(self, reg: _Registration, n: int) -> int:
        """Take up to ``n`` bytes from the budget; returns how many were granted."""
        with self._lock:
            granted = max(0, min(n, reg.cap - reg.used))
            reg.used += granted
            return granted


def _read_head(conn: socket.socket) -> bytes | None:
    """The HTTP head (through the blank line) or a whole first TLS record; None when the
    peer closes, sends too much or takes longer than ``_HEAD_TIMEOUT``."""
    conn.settimeout(_HEAD_TIMEOUT)
    data = b""
    try:
        while not _head_complete(data):
            chunk = conn.recv(4096)
            if not chunk:
                return None
            data += chunk
            if len(data) > _HEAD_LIMIT:
                return None
    except OSError:
        return None
    return data


def _head_complete(data: bytes) -> bool:
    if data[:1] == b"\x16":  # a TLS handshake record: wait for the whole record
        return len(data) >= 5 and len(data) >= 5 + int.from_bytes(data[3:5], "big")
    return b"\r\n\r\n" in data


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


def _authority(text: str, default_port: int) -> tuple[str, int] | None:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        host, port = text, str(default_port)
    host = host.strip("[]")
    return (host, int(port)) if host else None


def _parse_head(data: bytes) -> tuple[str, int, bytes | None] | None:
    """(host, port, bytes to forward, or None for CONNECT); None when unreadable."""
    if data[:1] == b"\x16":
        name = _sni(data)
        return (name, 443, data) if name else None
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].decode("latin-1").split()
    if len(parts) != 3:
        return None
    method, target, version = parts
    forward: bytes | None = data
    if method == "CONNECT":
        where, forward = _authority(target, 443), None
    elif target.startswith("/"):  # origin form: the Host header names the destination
        hosts = [ln[5:].strip().decode("latin-1") for ln in lines[1:] if ln[:5].lower() == b"host:"]
        where = _authority(hosts[0], 80) if len(hosts) == 1 else None
    elif target.startswith("http://"):
        authority, slash, path = target[len("http://") :].partition("/")
        where = _authority(authority, 80)
        request = f"{method} {slash}{path} {version}".encode("latin-1")
        kept = [ln for ln in lines[1:] if not ln.lower().startswith(b"proxy-")]
        forward = b"\r\n".join([request, *kept]) + b"\r\n\r\n" + rest
    else:
        where = None
    return None if where is None else (where[0], where[1], forward)


def _response(code: int, reason: str) -> bytes:
    """A complete HTTP response carrying ``reason``; the connection closes after it."""
    body = (reason + "\n").encode()
    head = f"HTTP/1.1 {code} {reason}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


def _reply(conn: socket.socket, code: int, reason: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(_response(code, reason))
