"""The key broker: a worker's private key stays in this (parent) process.

The sandbox holds only an opaque handle. It asks for signatures over the broker's unix
socket; the broker checks that the asking peer's host uid (``SO_PEERCRED``) is the one the
handle was issued to, frames the message with a domain-separation tag, signs it with
Ed25519 (libsodium through PyNaCl's cffi binding) and returns the signature. Every
connection holds a broker thread, so the peer uid is checked as soon as it is accepted:
a uid holding no handle, or already holding ``_MAX_CONNECTIONS_PER_UID`` connections, gets
an error line and is closed before any thread is started for it.

Zeroising (what Python can and cannot promise; also in docs/sandbox.md):

* The secret key lives only in ``bytearray`` buffers the broker allocates. They are
  ``sodium_mlock``-ed (never swapped, excluded from core dumps where the kernel supports
  ``MADV_DONTDUMP``) and wiped with ``sodium_memzero`` (which the compiler cannot elide)
  on ``release``/``close``. libsodium reads them in place through ``ffi.from_buffer``,
  so no immutable ``bytes`` copy of the key is ever made by the broker.
* It cannot promise more: a seed passed in as ``bytes`` is immutable and stays in the
  heap until the allocator reuses it (pass a ``bytearray``; the broker wipes it after
  copying); the process may have been forked (a forked child holds a copy-on-write copy
  until it execs); and nothing in Python stops a debugger or ``/proc/PID/mem`` reader with
  the same uid. Signatures and public keys are not secret and are ordinary ``bytes``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import struct
import threading
from pathlib import Path

from nacl._sodium import ffi, lib
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from charter.core.framing import SANDBOX_KEY_TAG, sandbox_key_signing_input
from charter.sandbox.errors import KeyHandleError, KeySeedError, SignatureTagError

__all__ = ["KeyBroker", "SIGNING_DOMAIN", "framed", "verify_signature"]

SIGNING_DOMAIN = SANDBOX_KEY_TAG
_TAG = re.compile(r"^[a-z0-9][a-z0-9./-]{0,63}$")
_SEED, _SK, _PK, _SIG = 32, 64, 32, 64
_REQUEST_LIMIT = 1 << 20
_REQUEST_TIMEOUT = 10.0  # seconds a peer may take to send its request line
# Concurrent connections per peer uid. Each holds a broker thread in the parent (outside
# the sandbox's cgroup) until its one line is answered or _REQUEST_TIMEOUT passes. A
# worker signs one request at a time, a few if it is threaded; 4 leaves room for that
# and bounds a sandbox's share of the parent at 4 threads, however many fds it can open.
_MAX_CONNECTIONS_PER_UID = 4


def framed(tag: str, message: bytes) -> bytes:
    """The signed bytes: domain, then length-prefixed tag and message."""
    if not _TAG.match(tag):
        raise SignatureTagError(f"signature tag {tag!r} must match {_TAG.pattern}")
    return sandbox_key_signing_input(tag.encode(), message)


def verify_signature(public_key: bytes, tag: str, message: bytes, signature: bytes) -> bool:
    """True when ``signature`` is the key's signature of ``message`` under ``tag``."""
    try:
        VerifyKey(public_key).verify(framed(tag, message), signature)
    except BadSignatureError:
        return False
    return True


class _Key:
    def __init__(self, seed: bytearray, host_uid: int | None) -> None:
        self.host_uid = host_uid
        self.secret = bytearray(_SK)
        self.public = bytearray(_PK)
        lib.sodium_mlock(ffi.from_buffer(self.secret), _SK)
        rc = lib.crypto_sign_seed_keypair(
            ffi.from_buffer(self.public), ffi.from_buffer(self.secret), ffi.from_buffer(seed)
        )
        if rc != 0:
            self.wipe()
            raise KeySeedError("libsodium refused the seed")

    def sign(self, data: bytes) -> bytes:
        out = ffi.new("unsigned char[]", _SIG + len(data))
        out_len = ffi.new("unsigned long long *")
        lib.crypto_sign(out, out_len, data, len(data), ffi.from_buffer(self.secret))
        return bytes(ffi.buffer(out, _SIG))

    def wipe(self) -> None:
        lib.sodium_memzero(ffi.from_buffer(self.secret), _SK)
        lib.sodium_munlock(ffi.from_buffer(self.secret), _SK)  # munlock also zeroes


class KeyBroker:
    """Holds worker keys; hands out handles; signs for the uid a handle was issued to."""

    def __init__(self, path: Path | None = None) -> None:
        self._keys: dict[str, _Key] = {}
        self._lock = threading.Lock()
        self._active: dict[int, int] = {}  # peer uid -> connections holding a thread
        self.path = path
        self._server: socket.socket | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._server.bind(str(path))
            os.chmod(path, 0o666)  # noqa: S103 (identity is SO_PEERCRED, not file modes)
            self._server.listen(16)
            threading.Thread(
                target=self._accept_loop, args=(self._server,), daemon=True, name="keys"
            ).start()

    def issue(self, seed: bytearray, *, host_uid: int | None = None) -> str:
        """Take a 32-byte Ed25519 seed (wiped here after use); return an opaque handle."""
        if len(seed) != _SEED:
            raise KeySeedError(f"an Ed25519 seed is {_SEED} bytes, not {len(seed)}")
        try:
            key = _Key(seed, host_uid)
        finally:
            lib.sodium_memzero(ffi.from_buffer(seed), len(seed))
        handle = "kh_" + secrets.token_urlsafe(24)
        with self._lock:
            self._keys[handle] = key
        return handle

    def public_key(self, handle: str) -> bytes:
        """The handle's public key (not secret: the parent uses it to verify)."""
        with self._lock:
            key = self._keys.get(handle)
        if key is None:
            raise KeyHandleError("unknown or released key handle")
        return bytes(key.public)

    def sign(self, handle: str, tag: str, message: bytes, *, host_uid: int | None = None) -> bytes:
        """Sign ``framed(tag, message)``; ``host_uid`` is the asking peer (None: in-process)."""
        with self._lock:
            key = self._keys.get(handle)
        if key is None:
            raise KeyHandleError("unknown or released key handle")
        if host_uid is not None and key.host_uid != host_uid:
            raise KeyHandleError("this key handle was issued to another sandbox")
        return key.sign(framed(tag, message))

    def release(self, handle: str) -> None:
        """Wipe the key; the handle is dead from now on."""
        with self._lock:
            key = self._keys.pop(handle, None)
        if key is not None:
            key.wipe()

    def close(self) -> None:
        with self._lock:
            handles = list(self._keys)
        for handle in handles:
            self.release(handle)
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
            if self.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()

    def __enter__(self) -> KeyBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def active(self, host_uid: int) -> int:
        """Connections from ``host_uid`` that hold a broker thread now."""
        with self._lock:
            return self._active.get(host_uid, 0)

    def _accept_loop(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed
                return
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        """On the accepting thread, before any thread exists for ``conn``: a uid holding
        no handle, or already holding ``_MAX_CONNECTIONS_PER_UID`` connections, is
        answered and closed without a byte read; otherwise it takes a slot and a thread."""
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            conn.close()
            return
        _, uid, _ = struct.unpack("3i", creds)
        refusal = None
        with self._lock:
            if not any(key.host_uid == uid for key in self._keys.values()):
                refusal = "no key handle was issued to this sandbox"
            elif self._active.get(uid, 0) >= _MAX_CONNECTIONS_PER_UID:
                refusal = "too many connections"
            else:
                self._active[uid] = self._active.get(uid, 0) + 1
        if refusal is not None:
            _refuse(conn, refusal)
            return
        try:
            threading.Thread(
                target=self._serve, args=(conn, uid), daemon=True, name=f"keys-conn-{uid}"
            ).start()
        except RuntimeError:  # the process is out of threads: refuse, give the slot back
            self._release(uid)
            _refuse(conn, "broker busy")

    def _release(self, uid: int) -> None:
        with self._lock:
            left = self._active.get(uid, 0) - 1
            if left > 0:
                self._active[uid] = left
            else:
                self._active.pop(uid, None)

    def _serve(self, conn: socket.socket, uid: int) -> None:
        """One admitted connection; its slot is given back however it ends."""
        try:
            with conn:
                self._answer(conn, uid)
        finally:
            self._release(uid)

    def _answer(self, conn: socket.socket, uid: int) -> None:
        """One JSON request line: {"handle", "tag", "message_hex"} → {"signature_hex"}."""
        # A peer that connects and never finishes its line must not hold this
        # thread (and its connection) forever.
        conn.settimeout(_REQUEST_TIMEOUT)
        try:
            with conn.makefile("rb") as reader:
                line = reader.readline(_REQUEST_LIMIT)
        except OSError:  # timed out or reset: there is nobody to answer
            return
        try:
            req = json.loads(line)
            sig = self.sign(
                str(req["handle"]), str(req["tag"]), bytes.fromhex(req["message_hex"]),
                host_uid=uid,
            )  # fmt: skip
            reply = {"signature_hex": sig.hex()}
        except KeyHandleError as e:
            reply = {"error": str(e)}
        except (ValueError, KeyError, TypeError):
            reply = {"error": "malformed request"}
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(reply).encode() + b"\n")


def _refuse(conn: socket.socket, error: str) -> None:
    """Answer and close on the accepting thread: one non-blocking send, which a fresh
    socket's empty buffer takes whole, so a peer that never reads cannot stall it."""
    with conn, contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.sendall(json.dumps({"error": error}).encode() + b"\n")
