"""The unix-socket server both brokers stand on: peers are known by host uid.

A sandbox reaches a broker through a socket bound into it, and the broker identifies it
by the peer's host uid (``SO_PEERCRED``: unique per live sandbox, so there is no token
to steal). Every admitted connection holds one thread in the control plane, outside the
sandbox's cgroup, so :class:`PeerServer` decides on the accepting thread, before any
thread exists and without reading a byte: a uid the broker does not know, or one already
holding ``max_per_uid`` connections, is answered once (one non-blocking send) and
closed. Otherwise the connection takes a slot and a thread that runs the broker's
handler; the slot is given back, and the connection closed, however the handler ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Literal

__all__ = ["PeerServer", "Refusal", "peer_uid"]

Refusal = Literal["unknown", "at-cap", "busy"]
"""Why a connection is turned away on accept: its uid is not known to the broker, it
already holds the most connections allowed, or no thread could be started for it."""

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(conn: socket.socket) -> int:
    """The host uid of the process at the other end of a unix socket (``SO_PEERCRED``)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    return int(_CREDS.unpack(creds)[1])


class PeerServer:
    """A threaded unix-socket server that admits peers by host uid, a few at a time.

    ``knows(uid)`` says whether the broker serves that uid at all; ``handler(conn, uid)``
    serves one admitted connection on its own thread (named ``<name>-conn-<uid>``);
    ``refusal(uid, why)`` returns the bytes a refused peer is sent (the broker may also
    record the refusal there). ``knows`` and ``refusal`` run on the accepting thread, so
    they must not block. The socket is mode 0666: identity is ``SO_PEERCRED``, not file
    permissions.
    """

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        max_per_uid: int,
        backlog: int,
        knows: Callable[[int], bool],
        handler: Callable[[socket.socket, int], None],
        refusal: Callable[[int, Refusal], bytes],
    ) -> None:
        self.path = path
        self.name = name
        self.max_per_uid = max_per_uid
        self.knows = knows
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
        """On the accepting thread: refuse an unknown uid or one at the cap without
        reading from it or starting a thread; otherwise take a slot and start one."""
        try:
            uid = peer_uid(conn)
        except OSError:
            conn.close()
            return
        if not self.knows(uid):
            self._refuse(conn, uid, "unknown")
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
