"""What the journal hands back (committed entries, entries read back, the first entry
init writes), and how a commit whose outcome was lost is settled by re-reading."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from charter.core.events import Event
from charter.ledger._app import Envelope, decode_state, encode_state
from charter.ledger._location import Location
from charter.ledger._rows import ChainRow, CommitOutcomeAmbiguousError, payload_bytes
from charter.ledger.errors import AppendFailedError, OutcomeUnknownError

__all__ = [
    "Committed",
    "Entry",
    "JournalCreated",
    "as_committed",
    "outcome_unknown",
    "rows_if_mine",
    "settle",
]


class JournalCreated(Event):
    """The first entry ``charter init`` writes: which key signs this journal's heads."""

    type_name = "JournalCreated"
    journal_key: str
    created_at: str


class Committed(NamedTuple):
    """One committed entry: where it landed, its chain hash, and its recorded time."""

    position: int
    hash: bytes
    event: Event
    recorded_at: datetime
    batch: str = ""  # the id of the append that wrote it (Journal.append's ``batch``)


@dataclass(frozen=True)
class Entry:
    """One journal entry as read back: stored bytes decoded, chain columns as stored."""

    position: int
    topic: str
    event: Event
    recorded_at: datetime
    stream: UUID
    stream_version: int
    hash: bytes
    prev_hash: bytes
    batch: str | None = None  # the append that wrote it (None: written before batch ids)

    @property
    def type_name(self) -> str:
        return type(self.event).type_name

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "type": self.type_name,
            "hash": self.hash.hex(),
            "prev_hash": self.prev_hash.hex(),
            "recorded_at": self.recorded_at.isoformat(),
            "batch": self.batch,
            "payload": self.event.payload(),
        }


def rows_if_mine(
    rows: Sequence[ChainRow | None], envelopes: Sequence[Envelope]
) -> list[ChainRow] | None:
    """The rows, if every one holds what this writer encoded for its envelope (compared
    after the commit time, which the recorder stamped under the lock); else None."""
    mine: list[ChainRow] = []
    for row, env in zip(rows, envelopes, strict=True):
        if row is None or payload_bytes(row.state) != payload_bytes(encode_state(env)):
            return None
        mine.append(row)
    return mine


def as_committed(rows: Sequence[ChainRow], envelopes: Sequence[Envelope]) -> tuple[Committed, ...]:
    return tuple(
        Committed(
            r.position, r.chain_hash, env.event, decode_state(r.topic, r.state)[0], env.batch or ""
        )
        for r, env in zip(rows, envelopes, strict=True)
    )


def outcome_unknown(location: Location, batch_id: str, cause: BaseException) -> OutcomeUnknownError:
    return OutcomeUnknownError(
        f"the connection to {location.display} was lost while batch {batch_id} was "
        f"committing, and whether it committed could not be settled ({cause}). Look it up "
        f"with `charter journal show --batch {batch_id}` before acting, or retry with the "
        "same batch id (it is never written twice)",
        batch=batch_id,
    )


def settle(
    store: object,
    error: CommitOutcomeAmbiguousError,
    envelopes: Sequence[Envelope],
    wait_s: float,
    location: Location,
) -> tuple[Committed, ...] | None:
    """The connection broke while this batch committed: re-read on a fresh connection,
    once the old session has ended. The committed entries if it landed, None if it
    definitely did not, OutcomeUnknownError if that cannot be known in ``wait_s``."""
    batch_id = envelopes[0].batch or ""
    settle_on: Callable[..., list[ChainRow | None] | None] | None = getattr(store, "settle", None)
    if settle_on is None or error.backend_pid <= 0:
        # Only PostgreSQL commits over a network; and a batch another writer took into
        # its commit (group commit) is in that writer's session, not one to wait for.
        raise outcome_unknown(location, batch_id, error) from error
    keys = [(env.originator_id.bytes, env.originator_version) for env in envelopes]
    rows = settle_on(error.backend_pid, keys, wait_s)
    if rows is None:
        raise outcome_unknown(location, batch_id, error) from error
    mine = rows_if_mine(rows, envelopes)
    if mine is not None:
        return as_committed(mine, envelopes)
    found = [(r, env) for r, env in zip(rows, envelopes, strict=True) if r is not None]
    if found and rows_if_mine([r for r, _ in found], [env for _, env in found]) is not None:
        # One transaction: all of it or none. Part of it is a broken promise.
        raise AppendFailedError("a batch was found only partly committed; run verify")
    return None
