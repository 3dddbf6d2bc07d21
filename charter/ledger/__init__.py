"""The storage engine: the durable, hash-chained, append-only journal.

Built on the eventsourcing library (its Application, notification log and process
recorders for SQLite and PostgreSQL, subclassed to chain each entry under the write
lock), with the fold base that read models follow the journal with. It knows
:class:`~charter.core.events.Event`, never the domain. See docs/journal.md.
"""

from charter.ledger._follow import Folds, JournalFold
from charter.ledger._location import Location, resolve_location
from charter.ledger._postgres import ChainedPostgresProcessRecorder
from charter.ledger._sqlite import ChainedSQLiteProcessRecorder, sqlite_uri
from charter.ledger.errors import (
    AlreadyTrackedError,
    AppendConflictError,
    AppendFailedError,
    BatchCommittedError,
    DeadlinePassedError,
    OutcomeUnknownError,
    UndecodableEntryError,
    UnknownSchemeError,
    WriterStalledError,
)
from charter.ledger.journal import Committed, Entry, Journal, JournalCreated

__all__ = [
    "Journal",
    "JournalCreated",
    "Committed",
    "Entry",
    "Folds",
    "JournalFold",
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
    "OutcomeUnknownError",
    "UndecodableEntryError",
    "UnknownSchemeError",
    "WriterStalledError",
]
