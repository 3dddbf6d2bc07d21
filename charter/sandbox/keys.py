"""The key broker: a worker's private key stays in this (parent) process.

The sandbox holds only an opaque handle. The launcher registers each sandbox (its host
uid, its id and its cgroup) when it is leased and unregisters it when it is discarded;
a handle is issued *to a sandbox* (its id), not to a host uid, and is wiped with that
sandbox's registration, so a later sandbox that gets the same host uid cannot use it.
The sandbox asks for signatures over the broker's unix socket; the broker identifies the
peer by its host uid (``SO_PEERCRED``) and its cgroup, checks that the handle was issued
to that sandbox, frames the message with a domain-separation tag, signs it with Ed25519
(libsodium through PyNaCl's cffi binding) and returns the signature.

Every connection holds a broker thread, and its work runs in the parent, outside the
sandbox's cgroup, so the peer is checked as soon as it is accepted
(:class:`~charter.sandbox._peer.PeerServer`, shared with the egress broker): a uid with
no registered sandbox holding a handle, a process outside that sandbox's cgroup, a
sandbox over its request allowance, or one already holding ``_MAX_CONNECTIONS_PER_UID``
connections, gets an error line and is closed before any thread is started for it. A
request is at most ``_REQUEST_LIMIT`` bytes (a ``_MESSAGE_LIMIT`` message in hex and
the JSON around it), and the bytes a sandbox's requests carry are charged to a byte
allowance (``_BYTES_PER_SECOND``), so the parent's CPU spent on one sandbox is bounded
by its allowance, whatever it sends.

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
from charter.sandbox._peer import Allowance, Member, PeerServer, Refusal
from charter.sandbox.errors import KeyHandleError, KeySeedError, SignatureTagError

__all__ = ["KeyBroker", "SIGNING_DOMAIN", "framed", "sandbox_cpu_s", "verify_signature"]

SIGNING_DOMAIN = SANDBOX_KEY_TAG
_TAG = re.compile(r"^[a-z0-9][a-z0-9./-]{0,63}$")
_SEED, _SK, _PK, _SIG = 32, 64, 32, 64
# The largest message a sandbox may have signed. What a worker signs is a report or a
# digest (a result over 64 KiB is hashed and the digest signed), so 64 KiB is generous;
# the request carries it in hex, with a handle (~35 bytes), a tag (<= 64) and JSON keys.
_MESSAGE_LIMIT = 64 * 1024
_REQUEST_LIMIT = 2 * _MESSAGE_LIMIT + 512
# A sandbox's allowance of broker work: requests a second (and burst), and request bytes
# a second (each one is read, JSON-parsed, hex-decoded and hashed twice by Ed25519). At
# these rates the parent spends a small fraction of one core on the busiest sandbox.
_REQUESTS_PER_SECOND = 20.0
_REQUEST_BURST = 20.0
_BYTES_PER_SECOND = 256 * 1024
_BYTE_BURST = 2 * _REQUEST_LIMIT
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


def sandbox_cpu_s(cgroup: tuple[str, ...]) -> float:
    """CPU the sandbox's processes have used so far, in seconds, as its own cgroup
    counts it (v2 ``cpu.stat`` ``usage_usec``, v1 ``cpuacct.usage``); 0 when neither
    can be read (so a broker that allows a multiple of it allows only its base)."""
    for d in cgroup:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(d, "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        with contextlib.suppress(OSError, ValueError):
            return int(Path(d, "cpuacct.usage").read_text()) / 1e9
    return 0.0


class _Key:
    def __init__(self, seed: bytearray, sandbox_id: str | None) -> None:
        self.sandbox_id = sandbox_id
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


class _Sandbox:
    """A registered sandbox: its id, and what the peer server checks of it."""

    def __init__(self, sandbox_id: str, member: Member) -> None:
        self.sandbox_id = sandbox_id
        self.member = member


class KeyBroker:
    """Holds worker keys; hands out handles bound to a sandbox; signs for that sandbox."""

    def __init__(self, path: Path | None = None) -> None:
        """Without ``path`` the broker signs in-process only; with it, sandboxes ask
        over a unix socket there."""
        self._keys: dict[str, _Key] = {}
        self._sandboxes: dict[int, _Sandbox] = {}  # host uid -> the live sandbox on it
        self._lock = threading.Lock()
        self.path = path
        # A second socket the broker serves beside its own, bound into each sandbox at
        # /run/charter/model.sock when set (the cell's model door: docs/model-door.md).
        self.model_path: Path | None = None
        self._server: PeerServer | None = None
        if path is not None:
            self._server = PeerServer(
                path, name="keys", max_per_uid=_MAX_CONNECTIONS_PER_UID, backlog=16,
                member=self._member, handler=self._answer, refusal=_refusal,
            )  # fmt: skip

    def register(self, host_uid: int, sandbox_id: str, *, cgroup: tuple[str, ...]) -> None:
        """The sandbox ``sandbox_id`` runs as ``host_uid`` in the cgroup directories
        ``cgroup`` (a peer must be in all of them; an empty tuple admits no one)."""
        allowance = Allowance(
            per_second=_REQUESTS_PER_SECOND, burst=_REQUEST_BURST,
            bytes_per_second=_BYTES_PER_SECOND, byte_burst=_BYTE_BURST,
        )  # fmt: skip
        with self._lock:
            self._sandboxes[host_uid] = _Sandbox(sandbox_id, Member(tuple(cgroup), allowance))

    def unregister(self, host_uid: int) -> None:
        """The sandbox on ``host_uid`` is discarded: forget it and wipe every key issued
        to it, so its handles die with it (a later sandbox on the uid cannot use them)."""
        with self._lock:
            gone = self._sandboxes.pop(host_uid, None)
            handles = (
                [h for h, k in self._keys.items() if k.sandbox_id == gone.sandbox_id]
                if gone is not None
                else []
            )
        for handle in handles:
            self.release(handle)

    def issue(self, seed: bytearray, *, sandbox_id: str | None = None) -> str:
        """Take a 32-byte Ed25519 seed (wiped here after use); return an opaque handle
        for the registered sandbox ``sandbox_id`` (None: for in-process signing only)."""
        if len(seed) != _SEED:
            lib.sodium_memzero(ffi.from_buffer(seed), len(seed))
            raise KeySeedError(f"an Ed25519 seed is {_SEED} bytes, not {len(seed)}")
        if sandbox_id is not None and not self._registered(sandbox_id):
            lib.sodium_memzero(ffi.from_buffer(seed), len(seed))
            raise KeyHandleError(f"sandbox {sandbox_id[:40]!r} is not registered (or gone)")
        try:
            key = _Key(seed, sandbox_id)
        finally:
            lib.sodium_memzero(ffi.from_buffer(seed), len(seed))
        handle = "kh_" + secrets.token_urlsafe(24)
        with self._lock:
            self._keys[handle] = key
        return handle

    def _registered(self, sandbox_id: str) -> bool:
        with self._lock:
            return any(s.sandbox_id == sandbox_id for s in self._sandboxes.values())

    def public_key(self, handle: str) -> bytes:
        """The handle's public key (not secret: the parent uses it to verify)."""
        with self._lock:
            key = self._keys.get(handle)
        if key is None:
            raise KeyHandleError("unknown or released key handle")
        return bytes(key.public)

    def sign(
        self, handle: str, tag: str, message: bytes, *, sandbox_id: str | None = None
    ) -> bytes:
        """Sign ``framed(tag, message)``; ``sandbox_id`` is the asking sandbox (None:
        in-process, which may use any handle)."""
        with self._lock:
            key = self._keys.get(handle)
        if key is None:
            raise KeyHandleError("unknown or released key handle")
        if sandbox_id is not None and key.sandbox_id != sandbox_id:
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
            self._sandboxes.clear()
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

    def sandbox_cpu_s(self, host_uid: int) -> float:
        """CPU the sandbox registered on ``host_uid`` has used (0 when none is)."""
        with self._lock:
            sbx = self._sandboxes.get(host_uid)
        return 0.0 if sbx is None else sandbox_cpu_s(sbx.member.cgroup)

    def _member(self, uid: int) -> Member | None:
        """On the accepting thread: only a registered sandbox holding a handle is served."""
        with self._lock:
            sbx = self._sandboxes.get(uid)
            if sbx is None or not any(k.sandbox_id == sbx.sandbox_id for k in self._keys.values()):
                return None
            return sbx.member

    def _answer(self, conn: socket.socket, uid: int) -> None:
        """One admitted connection, on its own thread (the server closes it after): one
        JSON request line {"handle", "tag", "message_hex"} → {"signature_hex"}."""
        with self._lock:
            sbx = self._sandboxes.get(uid)
        if sbx is None:  # unregistered since it was admitted: nothing to serve
            return
        # A peer that connects and never finishes its line must not hold this
        # thread (and its connection) forever.
        conn.settimeout(_REQUEST_TIMEOUT)
        try:
            with conn.makefile("rb") as reader:
                line = reader.readline(_REQUEST_LIMIT + 1)
        except OSError:  # timed out or reset: there is nobody to answer
            return
        sbx.member.allowance.charge(len(line))
        reply = self._reply(line, sbx.sandbox_id)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(reply).encode() + b"\n")

    def _reply(self, line: bytes, sandbox_id: str) -> dict[str, str]:
        if len(line) > _REQUEST_LIMIT:
            return {"error": f"request too large (at most {_REQUEST_LIMIT} bytes)"}
        try:
            req = json.loads(line)
            message = bytes.fromhex(req["message_hex"])
            if len(message) > _MESSAGE_LIMIT:
                return {"error": f"message too large (at most {_MESSAGE_LIMIT} bytes)"}
            sig = self.sign(str(req["handle"]), str(req["tag"]), message, sandbox_id=sandbox_id)
        except (KeyHandleError, SignatureTagError) as e:
            return {"error": str(e)}
        except (ValueError, KeyError, TypeError):
            return {"error": "malformed request"}
        return {"signature_hex": sig.hex()}


_REFUSALS: dict[Refusal, str] = {
    "unknown": "no key handle was issued to this sandbox",
    "outside": "not the sandbox",
    "over-rate": "over the request rate",
    "at-cap": "too many connections",
    "busy": "broker busy",
}


_REFUSAL_LINES = {
    why: json.dumps({"error": text}).encode() + b"\n" for why, text in _REFUSALS.items()
}


def _refusal(uid: int, why: Refusal) -> bytes:
    """The error line a peer refused on accept is sent."""
    return _REFUSAL_LINES[why]
