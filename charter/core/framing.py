"""Every hash and signature domain Charter uses, and the one framing of each.

Each domain has its own tag, so bytes framed for one purpose can never be read as
another; every variable-length field is length-prefixed, so no two different inputs
frame to the same bytes. ``tests/core/test_framing.py`` pins a known-answer vector per
tag: a change here that alters a single stored byte fails it.

| tag                          | what it frames                                        |
|------------------------------|-------------------------------------------------------|
| ``charter/entry/v1``         | a journal entry's chain hash (its stored bytes)       |
| ``charter/grant/v1``         | the bytes an issuer signs to seal a grant             |
| ``charter/grant-digest/v1``  | the digest that names a sealed grant                  |
| ``charter/custody/child/v1`` | a child's custody-key seed, derived from its parent's |
| ``charter/sandbox-key/v1``   | what the key broker signs on a worker's behalf        |
| ``charter/worker-inputs/v1`` | a scheduled worker's argv and inputs (its digest)     |

The entry hash: ``H = sha256(tag ‖ prev ‖ position ‖ len‖originator ‖ version ‖
len‖topic ‖ len‖state)``. The originator is hashed as its 16 raw UUID bytes on both
backends, so a journal hashes the same in SQLite (hex text) and PostgreSQL (uuid).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from hashlib import sha256
from typing import NamedTuple

__all__ = [
    "CHILD_KEY_TAG",
    "DIGEST_TAG",
    "ENTRY_TAG",
    "GENESIS",
    "HASH_SIZE",
    "SANDBOX_KEY_TAG",
    "SIGNATURE_TAG",
    "WORKER_INPUTS_TAG",
    "ChainRow",
    "child_seed",
    "entry_hash",
    "grant_digest",
    "grant_signing_input",
    "sandbox_key_signing_input",
    "worker_inputs_digest",
]

ENTRY_TAG = b"charter/entry/v1\x00"
SIGNATURE_TAG = b"charter/grant/v1\x00"
DIGEST_TAG = b"charter/grant-digest/v1\x00"
CHILD_KEY_TAG = b"charter/custody/child/v1\x00"
SANDBOX_KEY_TAG = b"charter/sandbox-key/v1\x00"
WORKER_INPUTS_TAG = b"charter/worker-inputs/v1\x00"

GENESIS = bytes(32)
HASH_SIZE = 32

# position u64, originator length u16, version i64 (big-endian, fixed width)
_HEAD = struct.Struct(">QH")
_VERSION_TOPIC_LEN = struct.Struct(">qI")
_LEN = struct.Struct(">I")
_LEN64 = struct.Struct(">Q")


class ChainRow(NamedTuple):
    """One stored journal entry, as the chain hashes it (raw bytes, never re-encoded)."""

    position: int
    originator: bytes
    version: int
    topic: str
    state: bytes
    prev_hash: bytes
    chain_hash: bytes


def entry_hash(
    prev: bytes, position: int, originator: bytes, version: int, topic: bytes, state: bytes
) -> bytes:
    """The chain hash of one entry, from its predecessor's hash and its stored bytes."""
    return sha256(
        b"".join(
            (
                ENTRY_TAG,
                prev,
                _HEAD.pack(position, len(originator)),
                originator,
                _VERSION_TOPIC_LEN.pack(version, len(topic)),
                topic,
                _LEN.pack(len(state)),
                state,
            )
        )
    ).digest()


def grant_signing_input(body: bytes) -> bytes:
    """What an issuer's Ed25519 key signs to seal a grant: the tag, then the body."""
    return SIGNATURE_TAG + body


def grant_digest(body: bytes, signature: bytes) -> bytes:
    """The digest naming a sealed grant: sha256(tag ‖ len‖body ‖ signature)."""
    return hashlib.sha256(DIGEST_TAG + _LEN.pack(len(body)) + body + signature).digest()


def child_seed(parent_seed: bytes, child_lineage: str) -> bytes:
    """A child's custody-key seed: HMAC-SHA256(parent seed, tag ‖ lineage)."""
    return hmac.digest(parent_seed, CHILD_KEY_TAG + child_lineage.encode(), "sha256")


def sandbox_key_signing_input(tag: bytes, message: bytes) -> bytes:
    """What the key broker signs for a worker: domain ‖ len‖tag ‖ len64‖message."""
    return SANDBOX_KEY_TAG + _LEN.pack(len(tag)) + tag + _LEN64.pack(len(message)) + message


def worker_inputs_digest(argv: tuple[str, ...], inputs: tuple[str, ...]) -> bytes:
    """sha256(tag ‖ u32 count‖(u32 len‖arg)… of ``argv`` ‖ the same of ``inputs``),
    each argument UTF-8 encoded: the digest a ``WorkerScheduled`` names its command by."""
    h = sha256(WORKER_INPUTS_TAG)
    for group in (argv, inputs):
        h.update(_LEN.pack(len(group)))
        for arg in group:
            data = arg.encode()
            h.update(_LEN.pack(len(data)) + data)
    return h.digest()
