"""The storage engine: the durable, hash-chained, append-only journal.

Built on the eventsourcing library (its Application, notification log and process
recorders for SQLite and PostgreSQL, subclassed to chain each entry under the write
lock), with the fold base that read models follow the journal with. It knows
:class:`~charter.core.events.Event`, never the domain. See docs/journal.md.

Every name is loaded when first asked for (``from charter.ledger import Journal``
works as always): the raw reader (:func:`open_reader`, :class:`JournalReader`) and the
location resolution load no eventsourcing, and the PostgreSQL recorder imports psycopg
only when a PostgreSQL journal is opened (issue 20 point 6), so an auditor's command
on a SQLite journal loads neither.
"""

from typing import TYPE_CHECKING

from charter.core.lazy import lazy_names

if TYPE_CHECKING:
    from charter.ledger._app import stream_uuid
    from charter.ledger._follow import Folds, JournalFold, cyclic_gc_paused
    from charter.ledger._location import Location, resolve_location
    from charter.ledger._postgres import ChainedPostgresProcessRecorder
    from charter.ledger._reader import JournalReader, open_reader
    from charter.ledger._snapshot import Snapshot, SnapshotFile
    from charter.ledger._sqlite import ChainedSQLiteProcessRecorder
    from charter.ledger._sqlite_store import sqlite_uri
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

__all__ = [
    "Journal",
    "JournalCreated",
    "JournalReader",
    "open_reader",
    "Committed",
    "CommitListener",
    "Entry",
    "Folds",
    "JournalFold",
    "cyclic_gc_paused",
    "Snapshot",
    "SnapshotFile",
    "Location",
    "resolve_location",
    "sqlite_uri",
    "stream_uuid",
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

# name -> the module that defines it, imported on first access
_LAZY = {
    **dict.fromkeys(("Folds", "JournalFold", "cyclic_gc_paused"), "charter.ledger._follow"),
    **dict.fromkeys(("Location", "resolve_location"), "charter.ledger._location"),
    **dict.fromkeys(("JournalReader", "open_reader"), "charter.ledger._reader"),
    **dict.fromkeys(("Snapshot", "SnapshotFile"), "charter.ledger._snapshot"),
    "sqlite_uri": "charter.ledger._sqlite_store",
    "stream_uuid": "charter.ledger._app",
    "CommitListener": "charter.ledger._listen",
    "ChainedSQLiteProcessRecorder": "charter.ledger._sqlite",
    "ChainedPostgresProcessRecorder": "charter.ledger._postgres",
    **dict.fromkeys(("Committed", "Entry", "Journal", "JournalCreated"), "charter.ledger.journal"),
    **dict.fromkeys((n for n in __all__ if n.endswith("Error")), "charter.ledger.errors"),
}


__getattr__ = lazy_names(__name__, _LAZY)
