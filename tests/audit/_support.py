"""Journals for the auditor's tests, and an attacker's tools (raw SQL, re-hashing)."""

from __future__ import annotations

from nacl.signing import SigningKey

from charter.core.framing import entry_hash
from charter.ledger import Journal
from tests.journal._support import Counter, Ping
from tests.journal.test_contract import _Raw

__all__ = ["Counter", "Ping", "_Raw", "fill", "make_journal", "rehash_from"]


def make_journal(url: str) -> tuple[Journal, SigningKey]:
    key = SigningKey.generate()
    return Journal.create(url, journal_key=bytes(key.verify_key).hex()), key


def fill(journal: Journal, batches: int, size: int = 3, tag: str = "w") -> None:
    for b in range(batches):
        journal.append(
            [Ping(writer=tag, batch=b, n=i, pad="p" * (b % 5)) for i in range(size - 1)]
            + [Counter(name=f"{tag}{b % 3}", value=b)]
        )


def rehash_from(url: str, raw: _Raw, position: int, state: bytes | None = None) -> None:
    """The consistent re-hash: (optionally) change the state of the entry at ``position``
    and recompute the chain from there on, so the chain walk alone finds nothing."""
    with Journal.open(url) as j:
        rows = list(j.rows())
    prev = bytes(32)
    for row in rows:
        if row.position < position:
            prev = row.chain_hash
            continue
        new_state = state if (row.position == position and state is not None) else row.state
        new_hash = entry_hash(
            prev, row.position, row.originator, row.version, row.topic.encode(), new_state
        )
        raw.execute(
            f"UPDATE {raw.table} SET state = ?, prev_hash = ?, chain_hash = ? WHERE {raw.pos} = ?",
            (new_state, prev, new_hash, row.position),
        )
        prev = new_hash
