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
| ``0x00`` / ``0x01``          | RFC 6962 Merkle leaf / interior node (no text tag)    |
| signed-note key id           | sha256(name ‖ 0x0A ‖ type ‖ Ed25519 key)[:4] (C2SP)   |
| ``cosignature/v1``           | what a witness signs (C2SP tlog-cosignature)          |
| ``charter/journal-key-rotation/v1`` | what the old and the new journal key both sign |

A Merkle leaf's input is an entry's frame: the exact bytes whose sha256 is its chain
hash (:func:`entry_frame`), so the tree commits to every stored byte and to the chain.

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
    "COSIGNATURE_HEADER",
    "ROTATION_TAG",
    "LEAF_PREFIX",
    "NODE_PREFIX",
    "NOTE_COSIGNATURE_V1",
    "NOTE_ED25519",
    "cosignature_message",
    "entry_frame",
    "entry_hash",
    "merkle_leaf_hash",
    "merkle_node_hash",
    "note_key_id",
    "grant_digest",
    "grant_signing_input",
    "key_rotation_signing_input",
    "sandbox_key_signing_input",
    "worker_inputs_digest",
]

ENTRY_TAG = b"charter/entry/v1\x00"
SIGNATURE_TAG = b"charter/grant/v1\x00"
DIGEST_TAG = b"charter/grant-digest/v1\x00"
CHILD_KEY_TAG = b"charter/custody/child/v1\x00"
SANDBOX_KEY_TAG = b"charter/sandbox-key/v1\x00"
WORKER_INPUTS_TAG = b"charter/worker-inputs/v1\x00"

# RFC 6962 §2.1: a leaf hash is sha256(0x00 ‖ input), an interior node sha256(0x01 ‖ l ‖ r).
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
# C2SP signed-note signature types (in key ids and verifier keys): a plain Ed25519 note
# signature, and a tlog-cosignature/v1 (Ed25519 over the cosignature message).
NOTE_ED25519 = b"\x01"
NOTE_COSIGNATURE_V1 = b"\x04"
# C2SP tlog-cosignature: the first line of what a witness signs.
COSIGNATURE_HEADER = b"cosignature/v1\n"

ROTATION_TAG = b"charter/journal-key-rotation/v1\x00"

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


def entry_frame(
    prev: bytes, position: int, originator: bytes, version: int, topic: bytes, state: bytes
) -> bytes:
    """The framed bytes of one entry: its chain hash is their sha256, and they are its
    Merkle leaf input."""
    return b"".join(
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


def entry_hash(
    prev: bytes, position: int, originator: bytes, version: int, topic: bytes, state: bytes
) -> bytes:
    """The chain hash of one entry, from its predecessor's hash and its stored bytes."""
    return sha256(entry_frame(prev, position, originator, version, topic, state)).digest()


def merkle_leaf_hash(leaf_input: bytes) -> bytes:
    """RFC 6962 leaf hash: sha256(0x00 ‖ leaf input)."""
    return sha256(LEAF_PREFIX + leaf_input).digest()


def merkle_node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 6962 interior node hash: sha256(0x01 ‖ left ‖ right)."""
    return sha256(NODE_PREFIX + left + right).digest()


def note_key_id(name: str, signature_type: bytes, public_key: bytes) -> bytes:
    """C2SP signed-note key id: sha256(name ‖ 0x0A ‖ signature type ‖ key)[:4]."""
    return sha256(name.encode() + b"\n" + signature_type + public_key).digest()[:4]


def cosignature_message(timestamp: int, checkpoint_body: bytes) -> bytes:
    """C2SP tlog-cosignature/v1: what a witness signs, ``cosignature/v1\\n``, ``time T\\n``,
    then the checkpoint's note body (its text up to and including the final newline
    before the blank line)."""
    return COSIGNATURE_HEADER + b"time " + str(timestamp).encode() + b"\n" + checkpoint_body


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


def key_rotation_signing_input(origin: str, old_key: bytes, new_key: bytes) -> bytes:
    """What both the old and the new journal key sign to rotate a journal's key:
    tag ‖ u16 len‖origin ‖ old key ‖ new key (32 bytes each)."""
    raw = origin.encode()
    return ROTATION_TAG + struct.pack(">H", len(raw)) + raw + old_key + new_key
