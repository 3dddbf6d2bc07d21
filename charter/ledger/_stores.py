"""Which store reads a journal's raw rows (SQLite file or PostgreSQL database), and
whether a location already holds a journal."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from charter.core.errors import BadInputError, StateError
from charter.ledger import _sqlite_store
from charter.ledger._location import Location

if TYPE_CHECKING:
    from charter.ledger import _pgstore

__all__ = ["Store", "refuse_existing", "store_for"]

Store: TypeAlias = "_sqlite_store.SQLiteJournalStore | _pgstore.PostgresJournalStore"


def store_for(location: Location) -> Store:
    if location.kind == "sqlite":
        if location.path is None:  # constructed only by resolve_location
            raise BadInputError("SQLite location without a path")
        return _sqlite_store.SQLiteJournalStore(location.path)
    # Imported here, not above: psycopg loads only when a PostgreSQL journal is opened.
    from charter.ledger import _pgstore

    return _pgstore.PostgresJournalStore(dict(location.conninfo or {}))


def _holds_journal(store: Store) -> bool:
    """Whether ``store`` has a Charter journal's metadata (what ``init`` writes)."""
    try:
        store.read_meta()
    except StateError:
        return False
    return True


def refuse_existing(location: Location, store: Store) -> None:
    if isinstance(store, _sqlite_store.SQLiteJournalStore) and store.exists():
        what = "a Charter journal" if _holds_journal(store) else "a file that is not a journal"
        raise StateError(
            f"{location.display} already holds {what}; refusing to initialise it again "
            "(choose another --db or CHARTER_HOME)"
        )
    if not isinstance(store, _sqlite_store.SQLiteJournalStore) and _holds_journal(store):
        raise StateError(
            f"{location.display} already holds a Charter journal; refusing to initialise it again"
        )
