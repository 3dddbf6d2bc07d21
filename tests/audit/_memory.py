"""An in-memory chain source: the journal's verification interface over a list of rows.

It implements :class:`charter.audit.ChainSource` exactly as the SQLite store does
(inclusive ``start``/``stop``, rows in position order, the originator stored as hex
text), so the pure verifier can be attacked without a database. The rows are framed by
an independent re-implementation of the documented entry hash, not by the code under
test. The same attacks run against real SQLite and PostgreSQL journals in
``test_chain_noticed.py``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import Any

from charter.core.framing import ChainRow

Row = tuple[int, str, int, str, bytes, bytes, bytes]


def ref_entry_hash(
    prev: bytes, position: int, originator: bytes, version: int, topic: bytes, state: bytes
) -> bytes:
    """The documented framing, written out again (see tests/core/test_framing.py)."""
    return hashlib.sha256(
        b"charter/entry/v1\x00"
        + prev
        + struct.pack(">QH", position, len(originator))
        + originator
        + struct.pack(">qI", version, len(topic))
        + topic
        + struct.pack(">I", len(state))
        + state
    ).digest()


def entry(prev: bytes, position: int, n: int) -> Row:
    """A well-formed row at ``position`` chained to ``prev``."""
    originator = f"{n:032x}"
    topic, state = f"TestPing/v{1 + n % 2}", b'{"n":%d}' % n
    chain = ref_entry_hash(prev, position, bytes.fromhex(originator), n, topic.encode(), state)
    return (position, originator, n, topic, state, prev, chain)


def chained(positions: list[int], first_prev: bytes = bytes(32), salt: int = 0) -> list[Row]:
    """Rows at ``positions``, each linked to the one before (a fresh chain)."""
    rows: list[Row] = []
    prev = first_prev
    for position in positions:
        rows.append(entry(prev, position, position + salt))
        prev = rows[-1][6]
    return rows


class MemorySource:
    """A journal's rows in memory, read in batches of ``batch`` rows."""

    def __init__(self, rows: list[Row], batch: int = 4) -> None:
        self.rows = sorted(rows)
        self.batch = batch

    def batches(self, start: int | None = None, stop: int | None = None) -> Iterator[list[Any]]:
        low, high = start or 0, 2**63 - 1 if stop is None else stop
        picked = [r for r in self.rows if low <= r[0] <= high]
        for i in range(0, len(picked), self.batch):
            yield picked[i : i + self.batch]

    def originator_bytes(self, stored: Any) -> bytes:
        return bytes.fromhex(stored)

    def predecessor(self, position: int) -> ChainRow | None:
        before = [r for r in self.rows if r[0] < position]
        if not before:
            return None
        p, o, v, t, s, prev, chain = before[-1]
        return ChainRow(p, bytes.fromhex(o), v, t, s, prev, chain)

    def position_of_hash(self, chain_hash: bytes) -> int | None:
        return next((r[0] for r in self.rows if r[6] == chain_hash), None)
