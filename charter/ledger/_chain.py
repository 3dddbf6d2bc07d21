"""The hash chain: one framing of an entry's stored bytes, and its hash.

``H = sha256(tag ‖ prev ‖ position ‖ len‖originator ‖ version ‖ len‖topic ‖ len‖state)``

Every variable-length field is length-prefixed and the tag separates this hash domain
from any other Charter hashes, so no two different entries frame to the same bytes.
The originator is hashed as its 16 raw UUID bytes on both backends, so a journal hashes
the same whether it lives in SQLite (hex text) or PostgreSQL (native uuid).
"""

from __future__ import annotations

import struct
from hashlib import sha256

__all__ = ["ENTRY_TAG", "GENESIS", "HASH_SIZE", "entry_hash"]

ENTRY_TAG = b"charter/entry/v1\x00"
GENESIS = bytes(32)
HASH_SIZE = 32

# position u64, originator length u16, version i64 (big-endian, fixed width)
_HEAD = struct.Struct(">QH")
_VERSION_TOPIC_LEN = struct.Struct(">qI")
_LEN = struct.Struct(">I")


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
