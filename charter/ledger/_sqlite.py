"""The SQLite journal adapter: chained eventsourcing recorders (the schema and the raw
reads are ``_sqlite_store``'s, which loads no eventsourcing).

The only module (with ``_postgres``) that imports a database driver. The chain is
computed inside the write transaction, which starts with ``BEGIN IMMEDIATE``: the
library's deferred ``BEGIN`` upgrades to a write lock only at the first INSERT and fails
across processes with "database is locked" after reading the head.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    StoredEvent,
)
from eventsourcing.sqlite import (
    SQLITE3_DEFAULT_LOCK_TIMEOUT,
    SQLiteApplicationRecorder,
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteCursor,
    SQLiteFactory,
    SQLiteProcessRecorder,
    SQLiteTransaction,
)

from charter.core.clock import now_ms
from charter.core.framing import GENESIS, entry_hash
from charter.ledger._group import Batch, SharedCommit, SpoolClosingFactory
from charter.ledger._rows import (
    Head,
    LastCommit,
    WriteLockTimeoutError,
    batch_of,
    check_guards,
    check_head,
    last_commit,
    set_last_commit,
    stamp_batch,
    stamp_of,
)
from charter.ledger._spool import Claimed
from charter.ledger._sqlite_store import (
    _APPEND_ONLY,
    _BATCH_RANGE,
    _CREATE_EVENTS,
    _HEAD,
    _INSERT,
    _INSERT_BATCH,
    _IS_ENTRY,
    TABLE,
    SQLiteJournalStore,
    schema_statements,
    sqlite_uri,
)

__all__ = [
    "ChainedSQLiteApplicationRecorder",
    "ChainedSQLiteFactory",
    "ChainedSQLiteProcessRecorder",
    "SQLiteJournalStore",
    "TABLE",
    "schema_statements",
    "sqlite_uri",
    "_BATCH_RANGE",
]

_Params = tuple[int, str, int, str, bytes, bytes, bytes]


class _ImmediateTransaction(SQLiteTransaction):
    """The library's transaction, opened with ``BEGIN IMMEDIATE`` (write lock first)."""

    def __enter__(self) -> SQLiteCursor:
        cursor = self.connection.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):  # SQLITE_BUSY after the busy timeout
                raise WriteLockTimeoutError(
                    f"another writer has held the journal's write lock for longer than the "
                    f"lock timeout ({e}); it may be stalled"
                ) from e
            raise OperationalError(e) from e
        return cursor


class _StatementCachingPool(SQLiteConnectionPool):
    """The library's pool, with a real prepared-statement cache. The library opens its
    connections with ``cached_statements=True``, a cache of one statement: BEGIN
    IMMEDIATE and the INSERT evict each other, and the INSERT (with the append-only
    triggers compiled into it) was prepared again for every append, ~35 us of a ~350 us
    single-event commit. Journals are made in WAL mode by ``create_schema``, so the
    library's switch to WAL on connect is not needed here."""

    def _create_connection(self) -> SQLiteConnection:
        try:
            c = sqlite3.connect(
                database=self.db_name,
                uri=True,
                check_same_thread=False,
                isolation_level=None,  # autocommit: the recorder sends BEGIN itself
                cached_statements=64,
                timeout=self.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT,
            )
        except (sqlite3.Error, TypeError) as e:
            raise InterfaceError(e) from e
        c.row_factory = sqlite3.Row
        return SQLiteConnection(c, max_age=self.max_age)


class ChainedSQLiteFactory(SpoolClosingFactory, SQLiteFactory):
    """The library's SQLite factory, its connections from :class:`_StatementCachingPool`;
    closing it lets go of its recorders' places in the writers' spool."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        library_pool = self.datastore.pool
        self.datastore.pool = _StatementCachingPool(
            db_name=library_pool.db_name, lock_timeout=library_pool.lock_timeout
        )
        library_pool.close()


_ENTRIES_BETWEEN = (
    f"SELECT rowid, originator_id, originator_version, chain_hash FROM {TABLE} "
    "WHERE rowid BETWEEN ? AND ? ORDER BY rowid"
)
_ENTRY_OF = (
    f"SELECT rowid, chain_hash, state FROM {TABLE} "
    "WHERE originator_id = ? AND originator_version = ?"
)


def _head_after(outcome: LastCommit | Exception, before: Head | None) -> Head | None:
    if isinstance(outcome, Exception) or not outcome.positions:
        return before
    return Head(outcome.positions[-1], outcome.hashes[-1], outcome.stamp)


class ChainedSQLiteApplicationRecorder(SharedCommit, SQLiteApplicationRecorder):
    """Stock recorder plus the hash chain, computed under the write lock."""

    def construct_create_table_statements(self) -> list[str]:
        return [_CREATE_EVENTS, *_APPEND_ONLY]

    _own_last: Head | None = None  # the head this recorder itself last committed

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Any:
        """Through the writers' turn and spool (:class:`SharedCommit`): SQLite has no
        queue for its write lock (decision 0006), and a waiting batch shares the
        leader's commit, one fsync for the group (decision 0007)."""
        return self._insert_shared(stored_events, kwargs)

    def _spool_place(self) -> Path:
        return Path(self.datastore.pool.db_name)

    def _lock_timeout_s(self) -> float:
        return float(self.datastore.pool.lock_timeout or 5)

    def _entries_between(self, first: int, last: int) -> list[tuple[int, UUID, int, bytes]]:
        with self.datastore.get_connection(commit=False) as conn:
            cursor = conn.cursor()
            cursor.execute(_ENTRIES_BETWEEN, (first, last))
            return [(r[0], UUID(r[1]), r[2], bytes(r[3])) for r in cursor.fetchall()]

    def _entries_of(
        self, keys: Sequence[tuple[UUID, int]]
    ) -> list[tuple[int, bytes, bytes] | None]:
        found: list[tuple[int, bytes, bytes] | None] = []
        with self.datastore.get_connection(commit=False) as conn:
            cursor = conn.cursor()
            for originator, version in keys:
                cursor.execute(_ENTRY_OF, (originator.hex, version))
                row = cursor.fetchone()
                found.append(None if row is None else (int(row[0]), bytes(row[1]), bytes(row[2])))
        return found

    def barrier_ms(self) -> int:
        """A commit time no later entry can precede: the write lock is taken (whoever
        held it has committed or rolled back), the clock is read under it, and the
        lock is given back. Every entry stamped before it has committed by then."""
        with (
            self.datastore.get_connection(commit=False) as conn,
            _ImmediateTransaction(conn, commit=False),
        ):
            return now_ms()

    def _commit_group(
        self, own: Batch, waiting: list[Claimed], hint: Head | None
    ) -> LastCommit | Exception:
        """One transaction: ``own`` (whose failure is raised, or returned if others
        share the transaction) and the waiting batches, each in its own savepoint so a
        refused batch (a conflict, a passed deadline) leaves the others whole. The
        waiting writers are answered after the commit."""
        # A hint that is this recorder's own last commit is no forgery: it need not be
        # looked up (the common case of one writer; a later commit by another writer
        # would have replaced it, or makes the insert after it conflict).
        head, head_is_own = hint, hint is not None and hint == self._own_last
        batches = [own, *(Batch.waiting(claimed.request) for claimed in waiting)]
        outcomes: list[LastCommit | Exception] = []
        conn: SQLiteConnection
        with (
            self.datastore.get_connection(commit=True) as conn,
            _ImmediateTransaction(conn, commit=True) as c,
            c,
        ):
            for batch in batches:
                if len(batches) == 1:
                    outcomes.append(self._insert_one(c, batch, head, head_is_own))
                else:
                    outcomes.append(self._insert_isolated(c, batch, head, head_is_own))
                after = _head_after(outcomes[-1], head)
                head_is_own = head_is_own if after == head else True
                head = after
        if head is not None and head != hint and self._turn is not None:
            self._turn.set_hint(head)
            self._own_last = head
        self._reply(waiting, outcomes[1:])
        return outcomes[0]

    def _insert_one(
        self, c: SQLiteCursor, batch: Batch, hint: Head | None, hint_is_own: bool
    ) -> LastCommit:
        self._insert_events(c, batch.events, hint=hint, hint_is_own=hint_is_own, **batch.kwargs)
        done = last_commit()
        if done is None:
            raise ProgrammingError("the recorder did not report the committed chain")
        return done

    def _insert_isolated(
        self, c: SQLiteCursor, batch: Batch, hint: Head | None, hint_is_own: bool
    ) -> LastCommit | Exception:
        c.execute("SAVEPOINT charter_batch")
        try:
            done = self._insert_one(c, batch, hint, hint_is_own)
        except (sqlite3.IntegrityError, IntegrityError, ProgrammingError) as e:
            c.execute("ROLLBACK TO charter_batch")
            c.execute("RELEASE charter_batch")
            return IntegrityError(e) if isinstance(e, sqlite3.Error) else e
        c.execute("RELEASE charter_batch")
        return done

    def _insert_events(
        self,
        c: SQLiteCursor,
        stored_events: Sequence[StoredEvent],
        *,
        hint: Head | None = None,
        hint_is_own: bool = False,
        **kwargs: Any,
    ) -> Sequence[int] | None:
        # Everything below runs under the write lock (BEGIN IMMEDIATE has taken it).
        check_guards(kwargs.get("guards") or (), self._stream_version(c))
        deadline = kwargs.get("deadline_ms")
        not_before = kwargs.get("not_before_ms")
        expect_head = kwargs.get("expect_head")
        if expect_head is not None or not_before is not None:
            hint = None  # pinned to the head: read it under the lock, never from a file
        if hint is not None and stored_events and not hint_is_own:
            # The hint comes from a file: use it only if it names a real entry, so the
            # insert right after it conflicts unless that entry is the head.
            c.execute(_IS_ENTRY, (hint.position, hint.hash))
            if c.fetchone() is None:
                hint = None
        if hint is not None and stored_events:
            stamped, stamp = stamp_batch(stored_events, hint.stamp, deadline)
            params = self._chain(hint, stamped)
            try:
                c.execute(_INSERT, params[0])
            except sqlite3.IntegrityError:
                pass  # stale: another writer's entry is already at that position
            else:
                return self._insert_rest(c, params, stamp, skip=1, batch=batch_of(stamped))
        # No hint, or a stale one: chain onto the head as read under the write lock (a
        # genuine conflict, such as a stream version already taken, raises from here).
        c.execute(_HEAD)
        row = c.fetchone()
        head = Head(row[0], bytes(row[1]), stamp_of(row[2])) if row else Head(0, GENESIS, None)
        # The head as this transaction sees it: its group's earlier batches included.
        check_head(expect_head, head.position)
        stamped, stamp = stamp_batch(stored_events, head.stamp, deadline, not_before)
        return self._insert_rest(
            c, self._chain(head, stamped), stamp, skip=0, batch=batch_of(stamped)
        )

    @staticmethod
    def _stream_version(c: SQLiteCursor) -> Callable[[UUID], int]:
        def version(originator: UUID) -> int:
            c.execute(
                f"SELECT MAX(originator_version) FROM {TABLE} WHERE originator_id = ?",
                (originator.hex,),
            )
            return int(c.fetchone()[0] or 0)

        return version

    @staticmethod
    def _chain(head: Head, stored_events: Sequence[StoredEvent]) -> list[_Params]:
        position, prev = head.position, head.hash
        params = []
        for s in stored_events:
            position += 1
            oid = s.originator_id
            oid_bytes = oid.bytes if isinstance(oid, UUID) else UUID(str(oid)).bytes
            h = entry_hash(
                prev, position, oid_bytes, s.originator_version, s.topic.encode(), s.state
            )
            params.append(
                (position, oid_bytes.hex(), s.originator_version, s.topic, s.state, prev, h)
            )
            prev = h
        return params

    def _insert_rest(
        self,
        c: SQLiteCursor,
        params: list[_Params],
        stamp: bytes,
        *,
        skip: int,
        batch: str | None,
    ) -> list[int]:
        rest = params[skip:]
        if len(rest) == 1:  # a lone append: execute is ~2x cheaper than executemany here
            c.execute(_INSERT, rest[0])
        elif rest:
            c.executemany(_INSERT, rest)
        if batch is not None and params:
            # Same transaction, under the write lock: an id already in the index is
            # refused here (the journal then answers with that id's entries or refuses).
            c.execute(_INSERT_BATCH, (batch, params[0][0], params[-1][0]))
        positions = tuple(p[0] for p in params)
        set_last_commit(LastCommit(positions, tuple(p[6] for p in params), stamp))
        return list(positions)


class ChainedSQLiteProcessRecorder(SQLiteProcessRecorder, ChainedSQLiteApplicationRecorder):
    """Tracking position, new events and their chain in one transaction (followers)."""
