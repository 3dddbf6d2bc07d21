"""The pure records of a stored journal, for the raw reader (``_sqlite_store``) as much
as for the recorders: its metadata, where the commit time and the batch id sit in a
stored state, and the batch index's name. No eventsourcing, no pydantic, no driver: an
auditor's command that only reads the rows loads none of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime

from charter.core.errors import StateError

__all__ = [
    "BATCHES_TABLE",
    "FORMAT",
    "SCHEMA_VERSION",
    "JournalMeta",
    "batch_id_of",
    "batch_runs",
    "payload_bytes",
    "stamp_of",
]

FORMAT = "charter-journal"
SCHEMA_VERSION = 1


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


@dataclass(frozen=True)
class JournalMeta:
    """Write-once facts about a journal, stored beside its events."""

    created_at: str
    journal_key: str  # hex Ed25519 public key that signs this journal's checkpoints
    format: str = FORMAT
    schema_version: int = SCHEMA_VERSION

    def to_rows(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}

    @classmethod
    def from_rows(cls, rows: dict[str, str], *, where: str) -> JournalMeta:
        """The metadata rows as read: every row one of the fields (``format`` and
        ``schema_version`` may be absent: their defaults), ``created_at`` and
        ``journal_key`` present, the version a decimal number; else StateError."""
        known = {f.name for f in fields(cls)}
        problems = [f"unknown key {k!r}" for k in sorted(set(rows) - known)]
        problems += [f"{k} missing" for k in ("created_at", "journal_key") if k not in rows]
        version = str(rows.get("schema_version", SCHEMA_VERSION)).strip()
        if not (version.isascii() and version.lstrip("+-").isdigit()):
            problems.append(f"schema_version {version!r} is not a whole number")
        if problems:
            raise StateError(
                f"{where} is not a Charter journal (bad metadata: {'; '.join(problems)})"
            )
        meta = cls(
            created_at=str(rows["created_at"]),
            journal_key=str(rows["journal_key"]),
            format=str(rows.get("format", FORMAT)),
            schema_version=int(version),
        )
        if meta.format != FORMAT:
            raise StateError(f"{where} is not a Charter journal (format {meta.format!r})")
        if meta.schema_version != SCHEMA_VERSION:
            raise StateError(
                f"{where} has journal schema v{meta.schema_version}; this Charter reads "
                f"v{SCHEMA_VERSION}"
            )
        return meta
