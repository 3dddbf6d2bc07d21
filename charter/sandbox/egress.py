"""The egress broker: the only way out of a sandbox is this unix socket.

Programs inside reach it as an HTTP(S) proxy on that socket; the request head is parsed
by h11 (:mod:`charter.sandbox._http`: ``CONNECT host:port`` or ``CONNECT [v6]:port``,
absolute-form ``GET http://host/...``, origin-form ``GET /path`` with a ``Host`` header,
or a raw TLS ClientHello, whose SNI names the destination).

The broker identifies the sandbox by the peer's host uid (``SO_PEERCRED``) *and* its
cgroup (:class:`~charter.sandbox._peer.PeerServer`, shared with the key broker), checks
the destination against the grant by name (:func:`charter.core.destination.admits`),
then resolves the name once and connects to an address it picked from that one answer:
a global address, or one an address entry of the grant names
(:func:`~charter.core.destination.grants_address`). Loopback, link-local (cloud
metadata), private, unspecified, multicast and other non-global addresses are refused
otherwise, and DNS rebinding cannot get around it: the address checked is the address
connected to. Before it connects, the broker journals :class:`EgressOpened` through the
callback the sandbox was registered with; if that append fails, nothing is opened. It
counts bytes in both directions against the egress byte budget, and records every
attempt, allowed or denied.

Attempts are recorded in aggregate, so a sandbox cannot grow the control plane's memory
(or the journal written at its exit) by flooding the broker: one record per
(destination, allowed, reason) with a count (and the bytes of its allowed connections
summed), destinations cut to ``_DESTINATION_KEPT`` characters, at most
``_MAX_RECORDS`` distinct records per sandbox, and every attempt beyond those counted in
one overflow record (destination ``(other)``, reason ``over the record cap``). A sandbox
therefore journals at most ``_MAX_RECORDS + 1`` EgressAttempted entries at its exit,
plus one EgressOpened per allowed connection, which its request allowance
(``_REQUESTS_PER_SECOND``, ``_REQUEST_BURST``) bounds.

Every admitted connection holds one broker thread in the control plane, outside the
sandbox's cgroup, so admission happens on the accepting thread before any thread exists:
a peer uid with no registration is answered 403 and closed (its attempt is kept in
``unknown_attempts`` without a destination: nothing is read from it), as is a process
with a registered uid outside that sandbox's cgroup; a sandbox over its request rate is
answered 429, and so is one already holding ``_MAX_CONNECTIONS_PER_UID`` connections.
A connection that sends no request head within ``_HEAD_TIMEOUT``, or whose tunnel moves
no byte either way for ``_IDLE_TIMEOUT``, is closed and gives its slot back.

Held credentials (:mod:`charter.sandbox._inject`): a broker made with ``credentials``
presents a held secret on a dial only when the sandbox's grant names the secret
(``EgressGrant.secrets``) *and* the secret is bound to the host and port actually dialed
(and the grant admits that destination, as for every dial). Such a dial must be plain
HTTP to the broker; the broker originates TLS to the destination and injects. Each
injection is journaled (:class:`CredentialInjected`, the secret's name, never its value)
with the connection's ``EgressOpened``, before anything is opened. A sandbox whose grant
says ``withhold_credentials`` (a test run) gets every such dial refused, journaled as
:class:`CredentialWithheld`: the destination is never reached, so no empty or stand-in
value is ever sent.
"""

from __future__ import annotations

import contextlib
import ipaddress
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from charter.core.destination import Destination, IPAddress, admits, grants_address, is_global
from charter.core.events import Event
from charter.core.secrets import HeldSecret, SecretName
from charter.sandbox._http import Head, parse_head, read_head, response
from charter.sandbox._inject import Conflict, Credentials
from charter.sandbox._peer import Allowance, Member, PeerServer, Refusal
from charter.sandbox.events import (
    CredentialInjected,
    CredentialWithheld,
    EgressAttempted,
    EgressOpened,
)

__all__ = [
    "Credentials",
    "DialRefusedError",
    "EgressBroker",
    "EgressGrant",
    "EgressJournal",
    "EgressTally",
    "Resolver",
    "WITHHELD_REASON",
]

EgressJournal = Callable[[Sequence[Event]], object]
"""Where the broker commits ``EgressOpened`` before it connects (``Journal.append``, an
``EventSink``'s ``append``); it must raise when the append did not commit."""

Resolver = Callable[[str, int], Sequence[tuple[Any, ...]]]
"""``socket.getaddrinfo``'s shape: (host, port) → [(family, type, proto, canonname,
sockaddr), ...]. Tests inject one to play a rebinding DNS server."""


def _getaddrinfo(host: str, port: int) -> Sequence[tuple[Any, ...]]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


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
# A sandbox's request allowance: connections admitted per second, and the burst. Each
# costs the control plane an accept, a cgroup read, a parse and (when allowed) a name
# resolution and a journal append, outside the sandbox's cgroup. 20 a second with a
# burst of 40 covers a worker's page loads and package fetches; a flood beyond it is
# answered 429 on the accepting thread, for the price of an accept and two lookups.
_REQUESTS_PER_SECOND = 20.0
_REQUEST_BURST = 40.0
OVERFLOW_DESTINATION = "(other)"
OVERFLOW_REASON = "over the record cap"
WITHHELD_REASON = "credentials withheld (test run)"


class EgressGrant(BaseModel):
    """Where a sandbox may connect, and optionally a byte cap lower than its budget's
    (``None``: the budget's egress bytes are the cap).

    Destinations are written in the one egress vocabulary of
    :mod:`charter.core.destination` (``api.example.com``, ``*.example.com``, an address
    or range such as ``10.0.0.7``, ``10.0.0.0/8``, ``[::1]``, each with an optional
    ``:port``), the same language a worker's grant speaks, so what the grant
    admits is exactly what the broker lets through. A malformed entry is refused here,
    when the grant is made, not silently matched against nothing later.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    destinations: tuple[Destination, ...] = ()
    byte_budget: int | None = Field(ge=0, default=None)
    # The held secrets the broker may present for this sandbox (the grant's secrets axis:
    # names only), and the test-run switch that withholds every one of them.
    secrets: tuple[SecretName, ...] = ()
    withhold_credentials: bool = False

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
    def __init__(
        self,
        sandbox_id: str,
        grant: EgressGrant,
        byte_cap: int,
        member: Member,
        journal: EgressJournal,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.grant = grant
        self.cap = byte_cap
        self.member = member
        self.journal = journal
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

    def __init__(
        self,
        path: Path,
        *,
        resolver: Resolver = _getaddrinfo,
        credentials: Credentials | None = None,
    ) -> None:
        """Serve on the unix socket ``path``; names are resolved with ``resolver`` (the
        host's ``getaddrinfo`` unless a test plays DNS); ``credentials`` are the held
        secrets it may present (see the module docstring)."""
        self.path = path
        self.resolver = resolver
        self.credentials = credentials
        self._lock = threading.Lock()
        self._regs: dict[int, _Registration] = {}
        # (uid, "?") per refused unknown peer: it is refused before a byte is read.
        self.unknown_attempts: deque[tuple[int, str]] = deque(maxlen=_UNKNOWN_KEPT)
        self._server = PeerServer(
            path, name="egress", max_per_uid=_MAX_CONNECTIONS_PER_UID, backlog=64,
            member=self._member, handler=self._serve, refusal=self._refusal,
        )  # fmt: skip

    # registration -----------------------------------------------------------------
    def register(
        self,
        host_uid: int,
        sandbox_id: str,
        grant: EgressGrant,
        *,
        byte_cap: int,
        cgroup: tuple[str, ...],
        journal: EgressJournal,
    ) -> None:
        """Admit the sandbox running as ``host_uid`` in the cgroup directories ``cgroup``
        (a peer must be in all of them; an empty tuple admits no one): ``grant``'s
        destinations, at most ``byte_cap`` bytes in both directions together (see
        :meth:`EgressGrant.byte_cap`). Each allowed connection is committed to
        ``journal`` as :class:`EgressOpened` before it is opened."""
        allowance = Allowance(per_second=_REQUESTS_PER_SECOND, burst=_REQUEST_BURST)
        member = Member(tuple(cgroup), allowance)
        with self._lock:
            self._regs[host_uid] = _Registration(sandbox_id, grant, byte_cap, member, journal)

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

    # a dial on a sandbox's behalf ---------------------------------------------------
    def send_as(self, host_uid: int, request: bytes, *, tls: bool = False, limit: int) -> bytes:
        """Send one whole HTTP request (``request``: its head, origin form with a
        ``Host``, and its body) for the sandbox on ``host_uid`` exactly as that
        sandbox's own dial through this broker would go: the grant's destinations, the
        address check, ``EgressOpened`` (and a held secret's ``CredentialInjected``)
        journaled before anything is opened, the held secrets bound to the dial, the
        byte budget; then read the answer until the destination closes, or ``limit``
        bytes. ``tls``: speak TLS to the destination (verified for the host named),
        unless a held secret's dial does already. For the control plane acting for a
        sandbox (the door's ``act``). Raises :class:`DialRefusedError` when refused
        before any byte of the request was sent; an ``OSError`` after that means it
        may have been sent."""
        with self._lock:
            reg = self._regs.get(host_uid)
        if reg is None:
            raise DialRefusedError(403, "unknown sandbox")
        head = parse_head(request)
        dest = _destination(head) if head is not None else "?"
        if head is not None and head.tunnel:
            head = None  # a whole request is sent, never a tunnel
        try:
            upstream, opened = self._open(host_uid, reg, head, dest)
            if tls and not isinstance(upstream, ssl.SSLSocket):
                upstream = _tls(upstream, opened.host)
        except _Refused as e:
            self._record(host_uid, reg, dest, False, e.reason)
            raise DialRefusedError(e.code, e.reason) from e
        out, got = opened.forward, 0
        chunks: list[bytes] = []
        try:
            upstream.settimeout(_IDLE_TIMEOUT)
            if self._charge(reg, len(out)) < len(out):
                self._record(host_uid, reg, dest, False, "egress byte budget exhausted")
                raise DialRefusedError(403, "egress byte budget exhausted")
            upstream.sendall(out)
            while got < limit:
                chunk = upstream.recv(min(65536, limit - got))
                if not chunk:
                    break
                granted = self._charge(reg, len(chunk))
                chunks.append(chunk[:granted])
                got += granted
                if granted < len(chunk):
                    break
        finally:
            upstream.close()
        self._record(host_uid, reg, dest, True, "closed", out=len(out), inn=got)
        return b"".join(chunks)

    # admission (on the accepting thread) ---------------------------------------------
    def _member(self, uid: int) -> Member | None:
        with self._lock:
            reg = self._regs.get(uid)
            return reg.member if reg is not None else None

    def _refusal(self, uid: int, why: Refusal) -> bytes:
        """The answer to a peer refused on accept, recorded where it is worth keeping."""
        if why in ("unknown", "outside"):
            # Not the sandbox: nothing of it goes into the sandbox's records.
            with self._lock:
                self.unknown_attempts.append((uid, "?" if why == "unknown" else "outside"))
            return response(403, "unknown sandbox" if why == "unknown" else "not the sandbox")
        if why == "busy":
            return response(503, "broker busy")
        with self._lock:
            reg = self._regs.get(uid)
        over = why == "over-rate"
        if reg is not None:  # counted into one record, however many there are
            reason = "over the request rate" if over else "too many concurrent connections"
            self._record(uid, reg, "?", False, reason)
        return response(429, "over the request rate" if over else "too many connections")

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
        read = read_head(conn, timeout=_HEAD_TIMEOUT, limit=_HEAD_LIMIT)
        conn.settimeout(_IDLE_TIMEOUT)  # no send to this peer may stall forever
        dest = _destination(read) if read is not None else "?"
        try:
            upstream, head = self._open(uid, reg, read, dest)
        except _Refused as e:
            self._record(uid, reg, dest, False, e.reason)
            _reply(conn, e.code, e.reason)
            return
        with upstream:
            upstream.settimeout(_IDLE_TIMEOUT)
            if head.tunnel:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            first = head.forward  # for a tunnel: what the client sent right after its head
            if self._charge(reg, len(first)) < len(first):
                self._record(uid, reg, dest, False, "egress byte budget exhausted")
                return
            if first:
                upstream.sendall(first)
            out, inn, reason = self._relay(conn, upstream, reg, len(first))
        cut = reason == "egress byte budget exhausted"
        self._record(uid, reg, dest, not cut, reason, out=out, inn=inn)

    def _open(
        self, uid: int, reg: _Registration, head: Head | None, dest: str
    ) -> tuple[socket.socket, Head]:
        """Check the head and the grant, resolve once, journal, connect: the upstream
        socket and the head, or _Refused with the reply's code and the recorded reason."""
        if head is None:
            raise _Refused(400, "malformed proxy request")
        if not reg.grant.allows(head.host, head.port):
            raise _Refused(403, "destination not in the grant")
        if reg.used >= reg.cap:
            raise _Refused(403, "egress byte budget exhausted")
        held = self._held(uid, reg, head, dest)
        # Everything a held secret needs is settled before anything is journaled or opened:
        # the TLS context, the headers (an identity token minted now), the rewritten head.
        creds = self.credentials
        tls = _prepare(creds, reg, head, held) if held and creds is not None else None
        family, sockaddr = self._pick(reg, head)
        opened: list[Event] = [EgressOpened(
            sandbox_id=reg.sandbox_id, host_uid=uid,
            destination=dest[:_DESTINATION_KEPT], address=str(sockaddr[0]),
        )]  # fmt: skip
        opened += [CredentialInjected(
            sandbox_id=reg.sandbox_id, host_uid=uid, secret=s.name, kind=s.kind,
            destination=dest[:_DESTINATION_KEPT],
        ) for s in held]  # fmt: skip
        try:  # committed before anything is opened; no commit, no connection
            reg.journal(opened)
        except Exception as e:  # any failure of the append refuses the connection
            raise _Refused(503, "journal append failed") from e
        upstream = None
        try:
            upstream = socket.socket(family, socket.SOCK_STREAM)
            upstream.settimeout(_CONNECT_TIMEOUT)
            upstream.connect(sockaddr)
        except OSError as e:
            if upstream is not None:
                upstream.close()
            raise _Refused(502, f"cannot connect: {e.strerror or e}") from e
        if tls is None:
            return upstream, head
        context, forward = tls
        try:  # the destination's certificate checked for the host dialed, ours presented
            secured = context.wrap_socket(upstream, server_hostname=head.host)
        except (OSError, ssl.SSLError) as e:
            upstream.close()
            raise _Refused(502, "tls to the destination failed") from e
        return secured, head._replace(forward=forward)

    def _held(self, uid: int, reg: _Registration, head: Head, dest: str) -> tuple[HeldSecret, ...]:
        """The held secrets this dial gets (granted to the sandbox and bound to the host
        and port dialed); refuses a dial that cannot carry them, and every such dial of
        a test run, journaling the withholding."""
        if self.credentials is None or not reg.grant.secrets:
            return ()
        held = self.credentials.bound(reg.grant.secrets, head.host, head.port)
        if not held:
            return ()
        if reg.grant.withhold_credentials:
            try:
                reg.journal([CredentialWithheld(
                    sandbox_id=reg.sandbox_id, host_uid=uid, secret=s.name,
                    destination=dest[:_DESTINATION_KEPT], reason=WITHHELD_REASON,
                ) for s in held])  # fmt: skip
            except Exception as e:  # the withholding must be on record, or nothing goes
                raise _Refused(503, "journal append failed") from e
            raise _Refused(403, WITHHELD_REASON)
        if head.tunnel or head.forward[:1] == b"\x16":
            raise _Refused(400, "held credentials: send plain http://host:port/ to the broker")
        return held

    def _pick(self, reg: _Registration, head: Head) -> tuple[int, tuple[Any, ...]]:
        """Resolve the destination once and pick the first address the grant lets the
        sandbox reach: a global one, or one an address entry grants. Raises _Refused."""
        try:
            answers = self.resolver(head.host, head.port)
        except (OSError, UnicodeError) as e:
            raise _Refused(502, "cannot resolve") from e
        for family, kind, _proto, _name, sockaddr in answers:
            if family not in (socket.AF_INET, socket.AF_INET6) or kind != socket.SOCK_STREAM:
                continue
            address = _ip(str(sockaddr[0]))
            if address is None:
                continue
            port = int(sockaddr[1])  # the port connected to, as the address is
            if is_global(address) or any(
                grants_address(entry, address, port) for entry in reg.grant.destinations
            ):
                return family, tuple(sockaddr)
        if not answers:
            raise _Refused(502, "cannot resolve")
        raise _Refused(403, "non-global address not granted")

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
                        # TLS decrypts whole records: what is already decrypted is not
                        # readable on the descriptor, so the selector would not wake.
                        while isinstance(src, ssl.SSLSocket) and data and src.pending():
                            data += src.recv(src.pending())
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


class DialRefusedError(Exception):
    """A dial :meth:`EgressBroker.send_as` refused before any byte of its request was
    sent: ``code`` is the status the broker answers a sandbox with, ``reason`` what it
    records."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _tls(upstream: socket.socket, host: str) -> socket.socket:
    """``upstream`` wrapped in TLS verified for ``host`` (the system's trust store)."""
    try:
        return ssl.create_default_context().wrap_socket(upstream, server_hostname=host)
    except (OSError, ssl.SSLError) as e:
        upstream.close()
        raise _Refused(502, "tls to the destination failed") from e


class _Refused(Exception):  # noqa: N818 (internal control flow, never escapes)
    """A request the broker answers with ``code`` and records with ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _prepare(
    credentials: Credentials, reg: _Registration, head: Head, held: tuple[HeldSecret, ...]
) -> tuple[ssl.SSLContext, bytes]:
    """The TLS context and the request head (held headers in) for a dial that presents
    ``held``; refuses secrets that conflict and a head that is not one HTTP request."""
    try:
        prepared = credentials.prepare(
            held, head.forward, head.host, head.port,
            subject=f"sandbox:{reg.sandbox_id}", now_s=int(time.time()),
        )  # fmt: skip
    except Conflict as e:
        raise _Refused(403, f"held credentials conflict: {e}") from e
    if prepared is None:
        raise _Refused(400, "malformed proxy request")
    return prepared


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None


def _destination(head: Head) -> str:
    """``host:port`` as recorded (``[v6]:port`` for an IPv6 literal)."""
    host = f"[{head.host}]" if ":" in head.host else head.host
    return f"{host}:{head.port}"


def _reply(conn: socket.socket, code: int, reason: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(response(code, reason))
