"""Plain records shared by the journal adapters (no driver imports here)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import NamedTuple
from uuid import UUID

from eventsourcing.persistence import (
    IntegrityError,
    PersistenceError,
    ProgrammingError,
    StoredEvent,
)
from pydantic import BaseModel, ConfigDict, ValidationError

from charter.core.errors import StateError
from charter.core.framing import ChainRow

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

FORMAT = "charter-journal"
SCHEMA_VERSION = 1


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


# Every stored state is canonical JSON with sorted keys, so it begins with the commit
# time: b'{"at":"2026-11-30T16:19:26.123456+00:00","payload":…'. The time is 32 bytes
# of fixed-width ISO text, so times compare as bytes and can be written in place.
_AT_PREFIX = b'{"at":"'
_AT_START = len(_AT_PREFIX)
_AT_END = _AT_START + 32
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def stamp_of(state: bytes) -> bytes:
    """The commit time stored in an entry's state (the ISO text, as bytes)."""
    return bytes(state[_AT_START:_AT_END])


def payload_bytes(state: bytes) -> bytes:
    """An entry's state after its commit time: what the writer encoded, unchanged."""
    return bytes(state[_AT_END:])


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


# The batch index (issue 21 point 2): one row per append, ``(batch, first_position,
# last_position)``, its batch id the primary key, written by the recorder in the same
# transaction as the entries, under the write lock. A second append with an id already
# there is refused by the database, so of two writers racing with one id exactly one
# commits; a lookup by id is one index read. Entries of one append are contiguous (one
# transaction under the write lock), so a range names them all.
BATCHES_TABLE = "charter_batches"

# Every state written with a batch id continues, after its commit time, with it:
# b'{"at":"<32 bytes>","batch":"<id>","payload":…' (sorted keys, canonical JSON).
_BATCH_PREFIX = b'","batch":"'


def batch_id_of(state: bytes) -> str | None:
    """The batch id an entry's stored state carries (None: written before batch ids)."""
    rest = bytes(state[_AT_END : _AT_END + len(_BATCH_PREFIX) + 80])
    if not rest.startswith(_BATCH_PREFIX):
        return None
    end = rest.find(b'"', len(_BATCH_PREFIX))
    if end < 0:
        return None
    try:
        return rest[len(_BATCH_PREFIX) : end].decode("ascii")
    except UnicodeDecodeError:
        return None


def batch_of(stored_events: Sequence[StoredEvent]) -> str | None:
    """The one batch id a batch's entries carry, for the index; None when they carry
    none. Entries naming different ids would make the index lie: refused."""
    ids = {batch_id_of(s.state) for s in stored_events}
    if len(ids) > 1:
        raise ProgrammingError(
            f"one batch's entries carry different batch ids: {sorted(map(str, ids))}"
        )
    return ids.pop() if ids else None


def batch_runs(rows: Iterable[tuple[int, bytes]]) -> list[tuple[str, int, int]]:
    """From ``(position, state prefix)`` in position order: each batch id's first run of
    consecutive entries ``(batch, first, last)``, to build the index of a journal made
    before it. An id met again in a later run (two appends that raced with one id before
    the index existed) keeps its first run: the later one stays in the journal, which is
    append-only, but is not what a lookup answers."""
    runs: dict[str, tuple[int, int]] = {}
    ended: set[str] = set()  # ids whose first run is over
    last_batch: str | None = None
    last_position: int | None = None
    for position, state in rows:
        batch = batch_id_of(state)
        if (
            batch is not None
            and batch == last_batch
            and last_position == position - 1
            and batch not in ended
        ):
            runs[batch] = (runs[batch][0], position)
        else:
            if last_batch is not None:
                ended.add(last_batch)
            if batch is not None and batch not in runs:
                runs[batch] = (position, position)
        last_batch, last_position = batch, position
    return [(batch, first, last) for batch, (first, last) in runs.items()]


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


class JournalMeta(BaseModel):
    """Write-once facts about a journal, stored beside its events."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = FORMAT
    schema_version: int = SCHEMA_VERSION
    created_at: str
    journal_key: str  # hex Ed25519 public key that signs this journal's checkpoints

    def to_rows(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.model_dump().items()}

    @classmethod
    def from_rows(cls, rows: dict[str, str], *, where: str) -> JournalMeta:
        try:
            meta = cls.model_validate(rows)
        except ValidationError as e:
            raise StateError(f"{where} is not a Charter journal (bad metadata: {e})") from None
        if meta.format != FORMAT:
            raise StateError(f"{where} is not a Charter journal (format {meta.format!r})")
        if meta.schema_version != SCHEMA_VERSION:
            raise StateError(
                f"{where} has journal schema v{meta.schema_version}; this Charter reads "
                f"v{SCHEMA_VERSION}"
            )
        return meta
