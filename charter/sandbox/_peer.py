"""The unix-socket server both brokers stand on: a peer is a registered sandbox only if its
host uid *and* its cgroup say so.

A sandbox reaches a broker through a socket bound into it. The broker identifies it by
the peer's host uid (``SO_PEERCRED``: one live sandbox per uid) and checks that the
connecting process is inside that sandbox's cgroup (``/proc/<pid>/cgroup`` of the
``SO_PEERCRED`` pid, read while a pidfd of the peer (``SO_PEERPIDFD``) shows that pid
still names it): a host process that merely runs as the sandbox's uid (a setuid file left
in a workspace, ``setpriv --reuid``) is not the sandbox, and cannot create, or move
itself into, a cgroup under the launcher's.

Every admitted connection holds one thread in the control plane, outside the sandbox's
cgroup, so :class:`PeerServer` decides on the accepting thread, before any thread exists
and without reading a byte: a uid the broker does not know, a process outside the
registered cgroup, a sandbox over its request rate (its :class:`Allowance`) or one
already holding ``max_per_uid`` connections is answered once (one non-blocking send) and
closed. Otherwise the connection takes a slot and a thread that runs the broker's
handler; the slot is given back, and the connection closed, however the handler ends.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, NamedTuple

from charter.sandbox._host import CGROUP_ROOT, own_cgroups

__all__ = ["Allowance", "Member", "PeerServer", "Refusal", "cgroup_dirs_of", "peer_uid"]

Refusal = Literal["unknown", "outside", "over-rate", "at-cap", "busy"]
"""Why a connection is turned away on accept: its uid is not known to the broker, the
process is not in that uid's sandbox cgroup, the sandbox has spent its request
allowance for now, it already holds the most connections allowed, or no thread could be
started for it."""

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
# SO_PEERPIDFD (Linux 6.5): a pidfd of the process that connected. Python 3.11 does not
# name it; the value is the same on every architecture.
_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)


def _creds(conn: socket.socket) -> tuple[int, int]:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    pid, uid, _ = _CREDS.unpack(creds)
    return int(pid), int(uid)


def peer_uid(conn: socket.socket) -> int:
    """The host uid of the process at the other end of a unix socket (``SO_PEERCRED``)."""
    return _creds(conn)[1]


def cgroup_dirs_of(pid: int) -> frozenset[str]:
    """The cgroup directories (under ``/sys/fs/cgroup``) process ``pid`` is in, one per v1
    controller (or the one v2 directory), named as ``_cgroup.cgroup_dirs`` names them."""
    text = Path(f"/proc/{pid}/cgroup").read_text()
    return frozenset(
        str(CGROUP_ROOT / controller / path.lstrip("/"))
        for controller, path in own_cgroups(text).items()
    )


def _peer_in(conn: socket.socket, pid: int, cgroup: tuple[str, ...]) -> bool:
    """True when the peer process ``pid`` is in every directory of ``cgroup`` (never for
    an empty ``cgroup``: fail closed). Anything unreadable is a no."""
    if not cgroup or pid <= 0:
        return False
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD)
    except OSError:  # a kernel without SO_PEERPIDFD: the pid could be reused; refuse
        return False
    try:
        dirs = cgroup_dirs_of(pid)
        # The peer still lives, so ``pid`` was its pid when its cgroup file was read
        # (not a reused one). Signal 0 checks existence and sends nothing.
        signal.pidfd_send_signal(pidfd, 0)
    except OSError:
        return False
    finally:
        os.close(pidfd)
    return set(cgroup) <= dirs


class Allowance:
    """A sandbox's budget of broker work: a token bucket of requests (``per_second``,
    up to ``burst``) and one of bytes (``bytes_per_second``, up to ``byte_burst``).

    A request is admitted only while both buckets hold something; the bytes a request
    turns out to cost are charged after it is read (:meth:`charge`) and may leave the byte
    bucket in debt, which the next requests wait out. So the work a sandbox can make a
    broker do is its rate times the time it runs, plus one burst and one request."""

    def __init__(
        self,
        *,
        per_second: float,
        burst: float,
        bytes_per_second: float = math.inf,
        byte_burst: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_second, self.burst = per_second, burst
        self.bytes_per_second, self.byte_burst = bytes_per_second, byte_burst
        self._clock = clock
        self._lock = threading.Lock()
        self._requests, self._bytes = burst, byte_burst
        self._at = clock()
        self.refused = 0  # requests turned away for the rate

    def _refill(self) -> None:
        now = self._clock()
        elapsed, self._at = max(0.0, now - self._at), now
        self._requests = min(self.burst, self._requests + elapsed * self.per_second)
        if not math.isinf(self._bytes):
            self._bytes = min(self.byte_burst, self._bytes + elapsed * self.bytes_per_second)

    def could_admit(self) -> bool:
        """Whether :meth:`admit` would take a request now (nothing is taken; a refusal
        is counted)."""
        with self._lock:
            self._refill()
            if self._requests >= 1 and self._bytes > 0:
                return True
            self.refused += 1
            return False

    def admit(self) -> bool:
        """Take one request if both buckets allow it."""
        with self._lock:
            self._refill()
            if self._requests >= 1 and self._bytes > 0:
                self._requests -= 1
                return True
            self.refused += 1
            return False

    def charge(self, n: int) -> None:
        """Charge ``n`` bytes of work to the byte bucket (it may go into debt)."""
        with self._lock:
            self._refill()
            self._bytes -= n


class Member(NamedTuple):
    """What a broker knows of a registered uid: the cgroup directories its sandbox's
    processes are in, and its allowance of broker work."""

    cgroup: tuple[str, ...]
    allowance: Allowance


class PeerServer:
    """A threaded unix-socket server that admits registered sandboxes, a few at a time.

    ``member(uid)`` is the broker's registration for that uid (None: not served);
    ``handler(conn, uid)`` serves one admitted connection on its own thread (named
    ``<name>-conn-<uid>``); ``refusal(uid, why)`` returns the bytes a refused peer is sent
    (the broker may also record the refusal there). ``member`` and ``refusal`` run on the
    accepting thread, so they must not block. The socket is mode 0666: identity is
    ``SO_PEERCRED`` and the cgroup, not file permissions.
    """

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        max_per_uid: int,
        backlog: int,
        member: Callable[[int], Member | None],
        handler: Callable[[socket.socket, int], None],
        refusal: Callable[[int, Refusal], bytes],
    ) -> None:
        self.path = path
        self.name = name
        self.max_per_uid = max_per_uid
        self.member = member
        self.handler = handler
        self.refusal = refusal
        self._lock = threading.Lock()
        self._active: dict[int, int] = {}  # peer uid -> connections holding a thread
        self._closed = False
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        os.chmod(path, 0o666)  # noqa: S103 (sandbox uids must connect; see the docstring)
        self._sock.listen(backlog)
        threading.Thread(target=self._accept_loop, daemon=True, name=name).start()

    def active(self, uid: int) -> int:
        """Connections from ``uid`` that hold a thread now."""
        with self._lock:
            return self._active.get(uid, 0)

    def close(self) -> None:
        """Stop accepting (the accept loop ends) and remove the socket file. Connections
        already admitted run on until their handlers return."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        """On the accepting thread: refuse an unknown uid, a process outside its
        sandbox's cgroup, a sandbox over its rate or one at the cap without reading from
        it or starting a thread; otherwise take a slot and start one."""
        try:
            pid, uid = _creds(conn)
        except OSError:
            conn.close()
            return
        member = self.member(uid)
        if member is None:
            self._refuse(conn, uid, "unknown")
            return
        # A sandbox flooding past its allowance is turned away for the price of the
        # lookups above; the cgroup is read only for a request the allowance would
        # admit, and the allowance is charged only for one from inside the sandbox (so a
        # process outside it cannot spend the sandbox's allowance).
        if not member.allowance.could_admit():
            self._refuse(conn, uid, "over-rate")
            return
        if not _peer_in(conn, pid, member.cgroup):
            self._refuse(conn, uid, "outside")
            return
        if not member.allowance.admit():
            self._refuse(conn, uid, "over-rate")
            return
        with self._lock:
            held = self._active.get(uid, 0)
            if held < self.max_per_uid:
                self._active[uid] = held + 1
        if held >= self.max_per_uid:
            self._refuse(conn, uid, "at-cap")
            return
        try:
            threading.Thread(
                target=self._serve, args=(conn, uid), daemon=True, name=f"{self.name}-conn-{uid}"
            ).start()
        except RuntimeError:  # the process is out of threads: give the slot back, refuse
            self._release(uid)
            self._refuse(conn, uid, "busy")

    def _serve(self, conn: socket.socket, uid: int) -> None:
        """One admitted connection; its slot is given back however the handler ends."""
        try:
            self.handler(conn, uid)
        finally:
            self._release(uid)
            conn.close()

    def _release(self, uid: int) -> None:
        with self._lock:
            left = self._active.get(uid, 0) - 1
            if left > 0:
                self._active[uid] = left
            else:
                self._active.pop(uid, None)

    def _refuse(self, conn: socket.socket, uid: int, why: Refusal) -> None:
        """Answer and close on the accepting thread: one non-blocking send, which a fresh
        socket's empty buffer takes whole, so a peer that never reads cannot stall it."""
        with conn, contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.sendall(self.refusal(uid, why))
