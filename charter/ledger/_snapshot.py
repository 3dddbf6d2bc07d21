"""Snapshots of in-process read state: derived bytes stored with the journal position
(and that entry's chain hash) they cover, so a new process catches up from there
instead of folding the journal from its start.

A snapshot is a cache, never a source of truth. It is used only when its format
version is the reader's, it names this journal, and the chain hash it recorded is the
hash of the journal's entry at its position now; otherwise it is ignored and the reader
folds from zero (fail safe, never wrong). A digest over the whole file catches a body
or header changed without it (a torn write, an edit). The body is opaque here: the
caller encodes and decodes it (data only, never pickle). The file lives in the Charter
home, beside the custody keys (mode 0600 in a 0700 directory), and is trusted as far as
they are: whoever can rewrite it with a fresh digest could already sign as the operator.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from pathlib import Path
from typing import NamedTuple

from charter.ledger.journal import Journal

__all__ = ["Snapshot", "SnapshotFile"]

_MAGIC = b"charter/views-snapshot/v1\0"
# position, that entry's chain hash, version digest, journal identity, body length;
# then the digest of the magic, header and body, then the body.
_HEADER = struct.Struct(">Q32s32s32sQ")
_DIGEST = 32


class Snapshot(NamedTuple):
    """A snapshot that matched the journal: the position it covers and its body."""

    position: int
    body: bytes


class SnapshotFile:
    """One journal's snapshot of one kind of read state, in ``directory``."""

    def __init__(self, directory: Path, journal: Journal, kind: str) -> None:
        self.journal = journal
        # The journal's identity: where it is and the key it was made with (a journal
        # rebuilt at the same place under the same key is caught by the chain hash).
        ident = f"{journal.location.display}\0{journal.meta.journal_key}".encode()
        self._journal_id = hashlib.sha256(ident).digest()
        self.path = directory / f"{kind}-{self._journal_id.hex()[:32]}.snapshot"

    def load(self, version: bytes) -> Snapshot | None:
        """The stored snapshot if it is one this reader can trust, else None."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return None
        head = len(_MAGIC) + _HEADER.size
        if len(data) < head + _DIGEST or not data.startswith(_MAGIC):
            return None
        header = data[len(_MAGIC) : head]
        position, chain, stored_version, journal_id, length = _HEADER.unpack(header)
        digest, body = data[head : head + _DIGEST], data[head + _DIGEST :]
        if (
            not hmac.compare_digest(digest, _digest(_MAGIC + header + body))
            or stored_version != _digest(version)
            or journal_id != self._journal_id
            or length != len(body)
            or position < 1
        ):
            return None
        row = self.journal.predecessor(position + 1)  # the entry at ``position``
        if row is None or row.position != position or bytes(row.chain_hash) != chain:
            return None
        return Snapshot(position, body)

    def save(self, version: bytes, position: int, body: bytes) -> bool:
        """Store ``body`` as covering the journal up to ``position`` (atomically: a
        reader sees the old snapshot or the new one). False if that entry is gone."""
        row = self.journal.predecessor(position + 1)
        if row is None or row.position != position:
            return False
        header = _HEADER.pack(
            position, bytes(row.chain_hash), _digest(version), self._journal_id, len(body)
        )
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + header + _digest(_MAGIC + header + body) + body)
        os.replace(temporary, self.path)
        return True


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()
