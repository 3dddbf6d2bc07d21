"""Plain records shared by the journal adapters (no driver imports here); the pure ones
(metadata, batch ids, commit times: no eventsourcing) are in ``_raw`` and named here too."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import NamedTuple
from uuid import UUID

from eventsourcing.persistence import (
    IntegrityError,
    PersistenceError,
    ProgrammingError,
    StoredEvent,
)

from charter.core.framing import ChainRow
from charter.ledger._raw import (
    _AT_END,
    _AT_PREFIX,
    _AT_START,
    _EPOCH,
    BATCHES_TABLE,
    FORMAT,
    SCHEMA_VERSION,
    JournalMeta,
    batch_id_of,
    batch_runs,
    payload_bytes,
    stamp_of,
)

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "Guards",
    "check_guards",
    "check_head",
    "ChainRow",
    "CommitOutcomeAmbiguousError",
    "CommitPastDeadlineError",
    "HeadMovedError",
    "WriteLockTimeoutError",
    "BATCHES_TABLE",
    "Head",
    "batch_id_of",
    "batch_of",
    "batch_runs",
    "payload_bytes",
    "stamp_batch",
    "stamp_of",
    "JournalMeta",
    "LastCommit",
    "PinnedStreamMovedError",
    "last_commit",
    "set_last_commit",
]


class LastCommit(NamedTuple):
    """Positions, hashes and the commit time the recorder assigned in its last insert."""

    positions: tuple[int, ...]
    hashes: tuple[bytes, ...]
    stamp: bytes  # the ISO commit time written into every entry of the batch


class Head(NamedTuple):
    """The last entry of the journal as a writer saw it under the write lock."""

    position: int
    hash: bytes
    stamp: bytes | None  # its commit time (None: the journal is empty)


class CommitOutcomeAmbiguousError(PersistenceError):
    """The connection broke while the batch was committing (the COMMIT may or may not
    have reached the server). Raised by a recorder, never retried there: the journal
    settles it by re-reading on a fresh connection once the old session has ended."""

    def __init__(self, message: str, *, backend_pid: int) -> None:
        super().__init__(message)
        self.backend_pid = backend_pid


class WriteLockTimeoutError(PersistenceError):
    """Another writer held the journal's write lock past the lock timeout, or a journal
    statement ran past the statement timeout: nothing was written. Raised by a recorder;
    not an OperationalError, so no connection retry waits the whole timeout again."""


class CommitPastDeadlineError(IntegrityError):
    """Raised by a recorder, under its write lock, when the batch would commit at or
    after a deadline its decision relied on (a lease's end, say)."""


def stamp_batch(
    stored_events: Sequence[StoredEvent],
    floor: bytes | None,
    deadline_ms: int | None,
    not_before_ms: int | None = None,
) -> tuple[list[StoredEvent], bytes]:
    """Under the write lock: give the batch its commit time and write it into each
    entry's state before the chain hashes them.

    The time is the wall clock now, or the head's time if the clock is behind it, so
    commit times never decrease with position. A batch that would commit at or after
    ``deadline_ms`` raises :class:`CommitPastDeadlineError`, one that would commit
    before ``not_before_ms`` raises :class:`HeadMovedError`; nothing is written.
    """
    stamp = datetime.now(UTC).isoformat(timespec="microseconds").encode()
    if floor is not None and floor > stamp:
        stamp = floor
    if len(stamp) != _AT_END - _AT_START:  # years outside 1000-9999
        raise ProgrammingError(f"commit time {stamp!r} is not a fixed-width time")
    if deadline_ms is not None or not_before_ms is not None:
        at_ms = (datetime.fromisoformat(stamp.decode()) - _EPOCH) // timedelta(milliseconds=1)
        if deadline_ms is not None and at_ms >= deadline_ms:
            raise CommitPastDeadlineError(
                f"the batch would commit at {stamp.decode()}, at or after the deadline "
                f"{deadline_ms} ms its decision relied on"
            )
        if not_before_ms is not None and at_ms < not_before_ms:
            raise HeadMovedError(
                f"the batch would commit at {stamp.decode()}, before {not_before_ms} ms, "
                "the time its decision took as settled"
            )
    stamped = []
    for s in stored_events:
        if not s.state.startswith(_AT_PREFIX):
            raise ProgrammingError("a stored state does not begin with its commit time")
        stamped.append(
            StoredEvent(
                originator_id=s.originator_id,
                originator_version=s.originator_version,
                topic=s.topic,
                state=_AT_PREFIX + stamp + s.state[_AT_END:],
            )
        )
    return stamped, stamp


def batch_of(stored_events: Sequence[StoredEvent]) -> str | None:
    """The one batch id a batch's entries carry, for the index; None when they carry
    none. Entries naming different ids would make the index lie: refused."""
    ids = {batch_id_of(s.state) for s in stored_events}
    if len(ids) > 1:
        raise ProgrammingError(
            f"one batch's entries carry different batch ids: {sorted(map(str, ids))}"
        )
    return ids.pop() if ids else None


class PinnedStreamMovedError(IntegrityError):
    """Raised by a recorder, under its write lock, when a pinned stream that the batch
    does not write to is no longer at the version the caller decided on."""


class HeadMovedError(PinnedStreamMovedError):
    """Raised by a recorder, under its write lock, when a batch pinned to the journal's
    head (``expect_head``) finds another entry there (anything committed since its
    decision read the journal), or would commit before its ``not_before_ms``."""


def check_head(expect_head: int | None, head: int) -> None:
    """Under the write lock: the journal's last position is still the one the decision
    read up to (``head``: as this transaction sees it, its group's earlier batches in)."""
    if expect_head is not None and head != expect_head:
        raise HeadMovedError(
            f"the journal's head is at position {head}, not {expect_head} where the "
            "decision read it: something committed in between"
        )


# A guard: (originator id, the version the caller's decision read).
Guards = tuple[tuple[UUID, int], ...]


def check_guards(guards: Guards, version: Callable[[UUID], int]) -> None:
    """Under the write lock: every guarded stream is still at its decided version."""
    for originator, expected in guards:
        if version(originator) != expected:
            raise PinnedStreamMovedError(
                f"stream {originator} moved past version {expected} after the decision"
            )


# What the recorder of this thread committed last: the Journal reads it after the
# library's save() returns (save() does not return the chain's hashes).
_last = threading.local()


def set_last_commit(value: LastCommit | None) -> None:
    _last.value = value


def last_commit() -> LastCommit | None:
    value: LastCommit | None = getattr(_last, "value", None)
    return value
