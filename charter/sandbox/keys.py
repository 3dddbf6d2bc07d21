"""The key broker: a worker's private key stays in this (parent) process.

The sandbox holds only an opaque handle. It asks for signatures over the broker's unix
socket; the broker checks that the asking peer's host uid (``SO_PEERCRED``) is the one the
handle was issued to, frames the message with a domain-separation tag, signs it with
Ed25519 (libsodium through PyNaCl's cffi binding) and returns the signature. Every
connection holds a broker thread, so the peer uid is checked as soon as it is accepted
(:class:`~charter.sandbox._peer.PeerServer`, shared with the egress broker): a uid holding
no handle, or already holding ``_MAX_CONNECTIONS_PER_UID`` connections, gets an error line
and is closed before any thread is started for it.

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
import re
import secrets
import socket
import threading
from pathlib import Path

from nacl._sodium import ffi, lib
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from charter.core.framing import SANDBOX_KEY_TAG, sandbox_key_signing_input
from charter.sandbox._peer import PeerServer, Refusal
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
    if not _TAG.fullmatch(tag):
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
        """Without ``path`` the broker signs in-process only; with it, sandboxes ask
        over a unix socket there."""
        self._keys: dict[str, _Key] = {}
        self._lock = threading.Lock()
        self.path = path
        self._server: PeerServer | None = None
        if path is not None:
            self._server = PeerServer(
                path, name="keys", max_per_uid=_MAX_CONNECTIONS_PER_UID, backlog=16,
                knows=self._knows, handler=self._answer, refusal=_refusal,
            )  # fmt: skip

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
        """Wipe every key and stop serving."""
        with self._lock:
            handles = list(self._keys)
        for handle in handles:
            self.release(handle)
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> KeyBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def active(self, host_uid: int) -> int:
        """Connections from ``host_uid`` that hold a broker thread now."""
        return self._server.active(host_uid) if self._server is not None else 0

    def _knows(self, uid: int) -> bool:
        """On the accepting thread: only a uid holding a handle is served at all."""
        with self._lock:
            return any(key.host_uid == uid for key in self._keys.values())

    def _answer(self, conn: socket.socket, uid: int) -> None:
        """One admitted connection, on its own thread (the server closes it after): one
        JSON request line {"handle", "tag", "message_hex"} → {"signature_hex"}."""
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
        except (KeyHandleError, SignatureTagError) as e:
            reply = {"error": str(e)}
        except (ValueError, KeyError, TypeError):
            reply = {"error": "malformed request"}
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(reply).encode() + b"\n")


_REFUSALS: dict[Refusal, str] = {
    "unknown": "no key handle was issued to this sandbox",
    "at-cap": "too many connections",
    "busy": "broker busy",
}


def _refusal(uid: int, why: Refusal) -> bytes:
    """The error line a peer refused on accept is sent."""
    return json.dumps({"error": _REFUSALS[why]}).encode() + b"\n"
