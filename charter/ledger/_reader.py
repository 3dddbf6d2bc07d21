"""An open journal to read: its metadata and its stored rows, and (SQLite) the tables
kept beside them in its file, without the eventsourcing application that appends.
:class:`~charter.ledger.journal.Journal` is this and the writer; an auditor's command
that only reads the rows, or keeps the Merkle tree beside them, opens this alone
(:func:`open_reader`) and loads no eventsourcing and no driver the journal does not use."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self

from charter.core.errors import InternalError, StateError
from charter.core.framing import ChainRow
from charter.ledger._location import Location, resolve_location
from charter.ledger._raw import JournalMeta
from charter.ledger._sqlite_store import SQLiteJournalStore
from charter.ledger._stores import Store, store_for

__all__ = ["JournalReader", "open_reader"]


class JournalReader:
    """An open journal's rows, read in position order; see :func:`open_reader`."""

    def __init__(
        self, location: Location, store: Store, meta: JournalMeta, *, read_only: bool = False
    ) -> None:
        self.location = location
        self.meta = meta
        self.read_only = read_only
        self._store = store
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def application(self) -> Any:
        """The eventsourcing application: a reader has none (a Journal opened to write
        has; PostgreSQL's Merkle tree is kept through its datastore)."""
        raise StateError(f"journal {self.location.display} was opened read-only")

    # -- reading -------------------------------------------------------------------

    def batches(self, start: int | None = None, stop: int | None = None) -> Iterator[list[Any]]:
        """Raw stored row tuples in position order, in batches (what verification reads)."""
        return self._store.batches(start, stop)

    def payloads(self, start: int | None = None, stop: int | None = None) -> Iterator[list[Any]]:
        """``(position, topic, state)`` in position order, in batches (read models)."""
        return self._store.payloads(start, stop)

    def originator_bytes(self, stored: Any) -> bytes:
        return self._store.originator_bytes(stored)

    def rows(self, start: int | None = None, stop: int | None = None) -> Iterator[ChainRow]:
        """Stored entries in position order, as :class:`ChainRow`."""
        conv = self._store.originator_bytes
        for batch in self._store.batches(start, stop):
            for pos, oid, ver, topic, state, prev, chain in batch:
                yield ChainRow(pos, conv(oid), ver, topic, state, prev, chain)

    def predecessor(self, position: int) -> ChainRow | None:
        return self._store.predecessor(position)

    def position_of_hash(self, chain_hash: bytes) -> int | None:
        return self._store.position_of_hash(chain_hash)

    def head(self) -> tuple[int, bytes] | None:
        """(position, hash) of the last entry, or None for an empty journal."""
        return self._store.head()

    # -- tables beside the journal -----------------------------------------------------

    @contextmanager
    def side_tables(self, *, write: bool) -> Iterator[Any]:
        """A cursor (rows by column name) in one transaction on a SQLite journal's file,
        for tables kept beside the journal (the Merkle tree's): with ``write`` under the
        write lock and committed when the block ends cleanly, else a read snapshot.
        Refused on a closed journal, and ``write`` on one opened read-only."""
        if self._closed:
            raise StateError(f"journal {self.location.display} was closed; open it again")
        if write and self.read_only:
            raise StateError(f"journal {self.location.display} was opened read-only")
        if not isinstance(self._store, SQLiteJournalStore):
            raise InternalError("only a SQLite journal keeps side tables through its reader")
        with self._store.side_tables(write=write) as cur:
            yield cur


def open_reader(url: str | Location | None = None, *, read_only: bool = False) -> JournalReader:
    """Open an existing journal's rows (and, unless ``read_only``, a SQLite journal's
    side tables to write): never creates or changes the journal itself."""
    location = resolve_location(url)
    store = store_for(location)
    try:
        meta = store.read_meta()
    except BaseException:
        store.close()
        raise
    return JournalReader(location, store, meta, read_only=read_only)
