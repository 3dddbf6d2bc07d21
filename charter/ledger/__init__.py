"""The storage engine: the durable, hash-chained, append-only journal.

Built on the eventsourcing library (its Application, notification log and process
recorders for SQLite and PostgreSQL, subclassed to chain each entry under the write
lock), with the fold base that read models follow the journal with. It knows
:class:`~charter.core.events.Event`, never the domain. See docs/journal.md.
"""

from typing import TYPE_CHECKING, Any

from charter.ledger._follow import Folds, JournalFold, cyclic_gc_paused
from charter.ledger._location import Location, resolve_location
from charter.ledger._snapshot import Snapshot, SnapshotFile
from charter.ledger._sqlite import ChainedSQLiteProcessRecorder, sqlite_uri
from charter.ledger.errors import (
    AlreadyTrackedError,
    AppendConflictError,
    AppendFailedError,
    BatchCommittedError,
    DeadlinePassedError,
    HeadPinLostError,
    OutcomeUnknownError,
    UndecodableEntryError,
    UnknownSchemeError,
    WriterStalledError,
)
from charter.ledger.journal import Committed, Entry, Journal, JournalCreated

if TYPE_CHECKING:
    from charter.ledger._postgres import ChainedPostgresProcessRecorder

__all__ = [
    "Journal",
    "JournalCreated",
    "Committed",
    "Entry",
    "Folds",
    "JournalFold",
    "cyclic_gc_paused",
    "Snapshot",
    "SnapshotFile",
    "Location",
    "resolve_location",
    "sqlite_uri",
    # the chained recorders (selected by PROCESS_RECORDER_TOPIC; subclassed by tests
    # that inject faults inside the write transaction)
    "ChainedSQLiteProcessRecorder",
    "ChainedPostgresProcessRecorder",
    "AlreadyTrackedError",
    "AppendConflictError",
    "AppendFailedError",
    "BatchCommittedError",
    "DeadlinePassedError",
    "HeadPinLostError",
    "OutcomeUnknownError",
    "UndecodableEntryError",
    "UnknownSchemeError",
    "WriterStalledError",
]


def __getattr__(name: str) -> Any:
    # The PostgreSQL recorder imports psycopg: loaded only when asked for (or when a
    # PostgreSQL journal is opened), so a command on a SQLite journal never imports
    # the driver (issue 20 point 6).
    if name == "ChainedPostgresProcessRecorder":
        from charter.ledger._postgres import ChainedPostgresProcessRecorder

        return ChainedPostgresProcessRecorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
