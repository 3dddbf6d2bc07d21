# SQL text is built only from module constants, never from input.
# ruff: noqa: S608
"""A SQLite journal's schema and its raw reads, with the standard library's driver
alone (no eventsourcing): what a reader of the rows needs (the chain walk, the Merkle
tree's follower, the auditor's commands) and what ``Journal.create`` writes. The
chained recorders that append are ``_sqlite``'s."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from charter.core.errors import StateError, UnavailableError
from charter.core.framing import ChainRow
from charter.ledger._raw import BATCHES_TABLE, JournalMeta, batch_runs

__all__ = ["SQLiteJournalStore", "TABLE", "schema_statements", "sqlite_uri"]

TABLE = "stored_events"  # the library's fixed name for SQLite

_CREATE_EVENTS = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    originator_id TEXT NOT NULL,
    originator_version INTEGER NOT NULL,
    topic TEXT NOT NULL,
    state BLOB NOT NULL,
    -- a unique predecessor makes a fork impossible: two entries cannot follow one head
    prev_hash BLOB NOT NULL UNIQUE CHECK (length(prev_hash) = 32),
    chain_hash BLOB NOT NULL CHECK (length(chain_hash) = 32),
    PRIMARY KEY (originator_id, originator_version)
)
"""

_APPEND_ONLY = [
    f"""CREATE TRIGGER IF NOT EXISTS {TABLE}_no_update BEFORE UPDATE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'charter journal is append-only: UPDATE refused'); END""",
    f"""CREATE TRIGGER IF NOT EXISTS {TABLE}_no_delete BEFORE DELETE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'charter journal is append-only: DELETE refused'); END""",
    # REPLACE (and INSERT OR REPLACE) deletes the row it conflicts with without firing
    # the DELETE trigger, so an insert that would meet an existing entry (its position,
    # its stream version, or its predecessor) is refused before it can replace it.
    f"""CREATE TRIGGER IF NOT EXISTS {TABLE}_no_replace BEFORE INSERT ON {TABLE}
        WHEN EXISTS (SELECT 1 FROM {TABLE} WHERE rowid = NEW.rowid)
          OR EXISTS (SELECT 1 FROM {TABLE} WHERE originator_id = NEW.originator_id
                     AND originator_version = NEW.originator_version)
          OR EXISTS (SELECT 1 FROM {TABLE} WHERE prev_hash = NEW.prev_hash)
        BEGIN SELECT RAISE(ABORT, 'charter journal is append-only: REPLACE refused'); END""",
    """CREATE TABLE IF NOT EXISTS charter_meta (
        key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID""",
    """CREATE TRIGGER IF NOT EXISTS charter_meta_no_update BEFORE UPDATE ON charter_meta
        BEGIN SELECT RAISE(ABORT, 'charter_meta is write-once'); END""",
    """CREATE TRIGGER IF NOT EXISTS charter_meta_no_delete BEFORE DELETE ON charter_meta
        BEGIN SELECT RAISE(ABORT, 'charter_meta is write-once'); END""",
    """CREATE TRIGGER IF NOT EXISTS charter_meta_no_replace BEFORE INSERT ON charter_meta
        WHEN EXISTS (SELECT 1 FROM charter_meta WHERE key = NEW.key)
        BEGIN SELECT RAISE(ABORT, 'charter_meta is write-once'); END""",
]

# The batch index (see BATCHES_TABLE in _rows): append-only like the journal, so an
# append's row cannot be replaced to hand its id to another batch.
_BATCHES = [
    f"""CREATE TABLE IF NOT EXISTS {BATCHES_TABLE} (
        batch TEXT PRIMARY KEY,
        first_position INTEGER NOT NULL,
        last_position INTEGER NOT NULL CHECK (last_position >= first_position)
    ) WITHOUT ROWID""",
    f"""CREATE TRIGGER IF NOT EXISTS {BATCHES_TABLE}_no_update BEFORE UPDATE ON {BATCHES_TABLE}
        BEGIN SELECT RAISE(ABORT, 'charter batch index is append-only'); END""",
    f"""CREATE TRIGGER IF NOT EXISTS {BATCHES_TABLE}_no_delete BEFORE DELETE ON {BATCHES_TABLE}
        BEGIN SELECT RAISE(ABORT, 'charter batch index is append-only'); END""",
    # Raised, not left to the primary key, so INSERT OR REPLACE cannot take an id over.
    f"""CREATE TRIGGER IF NOT EXISTS {BATCHES_TABLE}_no_replace BEFORE INSERT ON {BATCHES_TABLE}
        WHEN EXISTS (SELECT 1 FROM {BATCHES_TABLE} WHERE batch = NEW.batch)
        BEGIN SELECT RAISE(ABORT, 'UNIQUE constraint failed: charter_batches.batch'); END""",
]
_INSERT_BATCH = f"INSERT INTO {BATCHES_TABLE} (batch, first_position, last_position) VALUES (?,?,?)"
_BATCH_RANGE = f"SELECT first_position, last_position FROM {BATCHES_TABLE} WHERE batch = ?"
_HAS_BATCHES = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"

_INSERT = (
    f"INSERT INTO {TABLE} (rowid, originator_id, originator_version, topic, state, "
    "prev_hash, chain_hash) VALUES (?,?,?,?,?,?,?)"
)
_IS_ENTRY = f"SELECT 1 FROM {TABLE} WHERE rowid = ? AND chain_hash = ?"
_HEAD = f"SELECT rowid, chain_hash, substr(state, 1, 40) FROM {TABLE} ORDER BY rowid DESC LIMIT 1"

# Position bounds of a full read: from the lowest rowid SQLite allows, so a row planted
# at a position <= 0 is read (and reported by verify), never skipped.
_LOWEST = -(2**63)
_HIGHEST = 2**63 - 1


# The library's single-row tracking table, already "migrated" (its marker row), so a
# follower's tracking position commits in the same transaction as its events.
_TRACKING = [
    """CREATE TABLE IF NOT EXISTS tracking (application_name TEXT, notification_id INTEGER,
        PRIMARY KEY (application_name)) WITHOUT ROWID""",
    "INSERT INTO tracking VALUES ('__migration__', 1)",
]


def schema_statements() -> list[str]:
    """Every statement that makes a SQLite journal (events, triggers, tracking, meta)."""
    return [_CREATE_EVENTS, *_APPEND_ONLY, *_TRACKING, *_BATCHES]


def sqlite_uri(path: Path, mode: str) -> str:
    """A ``file:`` URI for ``path`` (percent-encoded: SQLite decodes URI paths, so a
    ``%`` or ``?`` in a file name must not be read as an escape or a query)."""
    return f"file:{quote(str(path))}?mode={mode}"


# Idle read connections kept per journal store; more concurrent readers than this open
# their own and close them after the read.
_MAX_IDLE_READERS = 8

# Which files a journal path and its -shm name now, as (device, inode) or None if absent.
_Files = tuple[tuple[int, int] | None, tuple[int, int] | None]


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class _IdleReaders:
    """Read connections of one journal file that this process may use again.

    Opening a connection per read cost ~0.3 ms (connect, ``PRAGMA query_only``, the
    access checks of :meth:`SQLiteJournalStore._read_uri`), against ~5 us for the query
    itself on an open one: a follower that reads many times per step paid mostly for
    connecting. A connection is taken for one read (a generator's until it is exhausted
    or closed) and given back only after its cursor is closed, so an idle one holds no
    read transaction: in autocommit mode, its next statement sees the latest commit.

    Each idle connection remembers the files it was opened on (the journal and its
    -shm). While any connection is open SQLite never removes the -shm, so if either is
    another file now, someone replaced the journal or deleted its side files under it:
    the connection (whose wal-index and page cache describe the old files) is closed,
    and the read opens a fresh one that meets the files as they are.

    Lock-free (``list.pop``/``append`` are atomic under the GIL), so a fork can never
    leave a lock held in the child. A forked child must not use its parent's
    connections (SQLite's locks are per process), nor close them (closing may
    checkpoint the parent's WAL): it keeps them referenced, untouched, and opens its
    own."""

    def __init__(self, path: Path) -> None:
        self._path = str(path)
        self._pid = os.getpid()
        self._idle: list[tuple[sqlite3.Connection, _Files]] = []
        self._inherited: list[list[tuple[sqlite3.Connection, _Files]]] = []
        self.closed = False

    def files(self) -> _Files:
        return _file_id(self._path), _file_id(f"{self._path}-shm")

    def take(self) -> tuple[sqlite3.Connection, _Files] | None:
        if self._pid != os.getpid():
            self._inherited.append(self._idle)
            self._idle, self._pid = [], os.getpid()
        now: _Files | None = None
        while True:
            try:
                conn, files = self._idle.pop()
            except IndexError:
                return None
            now = now or self.files()
            if files == now:
                return conn, files
            conn.close()  # opened on files that are not the journal's any more

    def give(self, conn: sqlite3.Connection, files: _Files) -> None:
        if self.closed or self._pid != os.getpid() or len(self._idle) >= _MAX_IDLE_READERS:
            conn.close()
            return
        if files[1] is None:  # it found no -shm: its first read made it
            files = files[0], _file_id(f"{self._path}-shm")
        self._idle.append((conn, files))
        if self.closed:  # closed while it was being given back: close() may have drained
            self.close()

    def close(self) -> None:
        self.closed = True
        if self._pid != os.getpid():
            return  # the parent's connections: not this process's to close
        while self._idle:
            with contextlib.suppress(IndexError):
                self._idle.pop()[0].close()


class SQLiteJournalStore:
    """Raw reads and schema set-up for a SQLite journal file (no eventsourcing here).
    A driver error of a read leaves as :class:`UnavailableError` (translated here).
    Reads of a file this process may write reuse their connections (:class:`_IdleReaders`)
    until :meth:`close`; other reads (an auditor's copy) open one per read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._readers = _IdleReaders(path)

    @contextlib.contextmanager
    def _driver_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise UnavailableError(
                f"SQLite journal {self.path} failed a read ({type(e).__name__}: {e})"
            ) from e

    def _connect(self, *, readonly: bool) -> sqlite3.Connection:
        return self._open(self._read_uri() if readonly else sqlite_uri(self.path, "rwc"), readonly)

    def _open(self, uri: str, readonly: bool) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                uri,
                uri=True,
                isolation_level=None,
                timeout=30,
                # A reader is reused by whichever thread reads next, one read at a time
                # (_IdleReaders hands each to one reader only).
                check_same_thread=False,
            )
            if readonly:
                conn.execute("PRAGMA query_only = 1")
        except sqlite3.Error as e:
            raise UnavailableError(f"cannot open SQLite journal {self.path}: {e}") from e
        return conn

    def _read_uri(self) -> str:
        """How a reader opens the file, leaving nothing beside it. Where this process
        may write the file and its directory: read-write but query-only (a mode=ro
        connection cannot remove the WAL side files when it closes, and would leave
        them behind after every read; mode=rw never creates a missing file). Where it
        may not (an auditor's copy): mode=ro, reading the WAL side files when a writer
        left both; without them, immutable=1, so that SQLite creates no -wal/-shm of
        its own (which it cannot in a read-only directory, and must not beside
        someone else's evidence)."""
        path, directory = str(self.path), str(self.path.parent)
        if os.access(path, os.W_OK) and os.access(directory, os.W_OK):
            return sqlite_uri(self.path, "rw")
        if all(os.access(f"{path}{suffix}", os.R_OK) for suffix in ("-wal", "-shm")):
            return sqlite_uri(self.path, "ro")
        return sqlite_uri(self.path, "ro") + "&immutable=1"

    @contextlib.contextmanager
    def _reading(self, *, translate: bool = True) -> Iterator[sqlite3.Connection]:
        """A query-only connection for one read, translating driver errors. It is kept
        for the next read only when the read ended cleanly (its cursors closed by the
        caller) and the file is this process's to write: a mode=rw connection removes
        the side files when the last one closes, and sees every later commit; a
        read-only or immutable one (an auditor's copy) is opened for each read as
        before, so a copy's state is judged afresh every time. ``translate=False``: driver
        errors propagate as they are (the caller says what could not be read)."""
        taken = self._readers.take()
        if taken is None:
            files = self._readers.files()  # before opening: a change after it is caught
            uri = self._read_uri()
            conn = self._open(uri, readonly=True)
            reusable = uri == sqlite_uri(self.path, "rw")
        else:
            (conn, files), reusable = taken, True
        try:
            with self._driver_errors() if translate else contextlib.nullcontext():
                yield conn
        except BaseException:
            conn.close()  # a failed read's connection may be unusable: never reused
            raise
        if reusable and not conn.in_transaction:
            self._readers.give(conn, files)
        else:
            conn.close()

    def close(self) -> None:
        """Close the idle read connections (the last one to close removes the WAL side
        files); a read still running closes its connection when it ends."""
        self._readers.close()

    def exists(self) -> bool:
        return self.path.exists()

    def read_meta(self) -> JournalMeta:
        """The journal's metadata; raises StateError if this is not a Charter journal."""
        try:
            present = self.path.is_file()
        except OSError as e:  # is_file() hides "not there", not "may not look"
            raise UnavailableError(f"cannot read the journal {self.path}: {e.strerror}") from e
        if not present:
            raise StateError(
                f"no Charter journal at {self.path}; run `charter init` to create one, or "
                "point --db (or CHARTER_HOME) at an existing journal"
            )
        if not os.access(self.path, os.R_OK):
            raise UnavailableError(
                f"cannot read the journal {self.path}: permission denied; ask its owner "
                "for read access (a copy works too)"
            )
        conn = self._connect(readonly=True)
        try:
            rows = conn.execute("SELECT key, value FROM charter_meta").fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" not in str(e):  # a journal this process cannot read
                raise UnavailableError(f"cannot read the journal {self.path}: {e}") from e
            raise StateError(
                f"{self.path} is not a Charter journal ({e}); point --db at a journal "
                "made by `charter init`"
            ) from None
        except sqlite3.DatabaseError as e:
            raise StateError(
                f"{self.path} is not a Charter journal ({e}); point --db at a journal "
                "made by `charter init`"
            ) from None
        finally:
            conn.close()
        return JournalMeta.from_rows(dict(rows), where=str(self.path))

    def create_schema(self, meta: JournalMeta, *, reuse_empty: bool = False) -> None:
        """Create every table (events, tracking, meta) in one transaction. The file must
        not exist yet (it is created exclusively, so of two racing inits one loses
        cleanly), or with ``reuse_empty`` be an empty database (an init killed right
        after creating it). If anything fails, a file this call created is removed;
        nothing else is."""
        created = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not (reuse_empty and self.path.exists()):
                try:
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    raise StateError(
                        f"{self.path} was created by someone else meanwhile; refusing to "
                        "initialise it"
                    ) from None
                os.close(fd)
                created = True
            conn = self._connect(readonly=False)
        except OSError as e:
            raise UnavailableError(f"cannot create SQLite journal {self.path}: {e}") from e
        try:
            # Checked before anything is written (the journal mode is written to the file).
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                raise StateError(f"{self.path} is not empty; refusing to initialise it")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                conn.execute("ROLLBACK")  # another init got there first: not ours to undo
                raise StateError(f"{self.path} was initialised by someone else meanwhile")
            for statement in schema_statements():
                conn.execute(statement)
            conn.executemany(
                "INSERT INTO charter_meta (key, value) VALUES (?, ?)", meta.to_rows().items()
            )
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            conn.close()
            if created:
                self.remove()
            raise UnavailableError(f"cannot create SQLite journal {self.path}: {e}") from e
        finally:
            conn.close()

    def has_batch_index(self) -> bool:
        """Whether the journal has its batch index (journals made before it do not)."""
        return self._fetchone(_HAS_BATCHES, (BATCHES_TABLE,)) is not None

    def batch_range(self, batch: str) -> tuple[int, int] | None:
        """The positions one append wrote, by its id: one read of the index's key."""
        row = self._fetchone(_BATCH_RANGE, (batch,))
        return None if row is None else (int(row[0]), int(row[1]))

    def add_batch_index(self) -> int:
        """Make the batch index of a journal made before it, from the entries' stored
        ids, in one transaction under the write lock (so no append lands between the
        read and the index); a no-op if another writer made it first. Returns the
        number of batches indexed."""
        conn = self._connect(readonly=False)
        try:
            conn.execute("BEGIN IMMEDIATE")
            if conn.execute(_HAS_BATCHES, (BATCHES_TABLE,)).fetchone() is not None:
                conn.execute("ROLLBACK")
                return 0
            for statement in _BATCHES:
                conn.execute(statement)
            rows = conn.execute(f"SELECT rowid, substr(state, 1, 128) FROM {TABLE} ORDER BY rowid")
            runs = batch_runs((int(pos), bytes(head)) for pos, head in rows)
            conn.executemany(_INSERT_BATCH, runs)
            conn.execute("COMMIT")
            return len(runs)
        except sqlite3.Error as e:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise UnavailableError(
                f"SQLite journal {self.path}: its batch index could not be made ({e})"
            ) from e
        finally:
            conn.close()

    def remove(self) -> None:
        """Delete the journal file and its WAL files (only a file this process has just
        created, in a creation that failed)."""
        for suffix in ("", "-wal", "-shm", "-writer"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # only if no writer is waiting in it
            Path(f"{self.path}-spool").rmdir()

    #: converts the stored originator column to its 16 raw bytes
    originator_bytes = staticmethod(bytes.fromhex)

    def batches(self, start: int | None = None, stop: int | None = None) -> Iterator[list[Any]]:
        """Raw row tuples in position order, in batches: (position, originator as stored,
        version, topic, state, prev_hash, chain_hash). The fast path for verification."""
        yield from self._fetch_batches(
            "SELECT rowid, originator_id, originator_version, topic, state, prev_hash, "
            f"chain_hash FROM {TABLE} WHERE rowid >= ? AND rowid <= ? ORDER BY rowid",
            start,
            stop,
        )

    def payloads(self, start: int | None = None, stop: int | None = None) -> Iterator[list[Any]]:
        """``(position, topic, state)`` tuples in position order, in batches: what a
        read model folds (three columns instead of seven)."""
        yield from self._fetch_batches(
            f"SELECT rowid, topic, state FROM {TABLE} WHERE rowid >= ? AND rowid <= ? "
            "ORDER BY rowid",
            start,
            stop,
        )

    def _fetch_batches(self, sql: str, start: int | None, stop: int | None) -> Iterator[list[Any]]:
        # The cursor is closed however the caller leaves (exhausted, or the generator
        # closed mid-way), so no read transaction outlives the read.
        bounds = (_LOWEST if start is None else start, _HIGHEST if stop is None else stop)
        with self._reading() as conn, contextlib.closing(conn.execute(sql, bounds)) as cur:
            while batch := cur.fetchmany(10_000):
                yield batch

    def _fetchone(self, sql: str, params: tuple[Any, ...]) -> Any:
        with self._reading() as conn, contextlib.closing(conn.execute(sql, params)) as cur:
            return cur.fetchone()

    def stream_versions(self, originators: Sequence[bytes]) -> dict[bytes, int]:
        """The last version of each stream that has one (one read for them all)."""
        if not originators:
            return {}
        # One MAX per stream, each a descent of the primary key's index: a MAX grouped
        # by stream over ``IN (...)`` reads every entry of each stream (a lease's grows
        # with each usage charged to it).
        marks = ",".join(["(?)"] * len(originators))
        sql = (
            f"WITH ids(id) AS (VALUES {marks}) SELECT id, (SELECT MAX(originator_version) "
            f"FROM {TABLE} WHERE originator_id = ids.id) FROM ids"
        )
        params = tuple(o.hex() for o in originators)
        with self._reading() as conn, contextlib.closing(conn.execute(sql, params)) as cur:
            return {
                bytes.fromhex(oid): int(version)
                for oid, version in cur.fetchall()
                if version is not None
            }

    def find(self, originator: bytes, version: int) -> ChainRow | None:
        """The entry of one stream version, if it is in the journal."""
        return self._one(
            "WHERE originator_id = ? AND originator_version = ?", (originator.hex(), version)
        )

    def _one(self, where: str, params: tuple[Any, ...]) -> ChainRow | None:
        row = self._fetchone(
            "SELECT rowid, originator_id, originator_version, topic, state, prev_hash, "
            f"chain_hash FROM {TABLE} {where}",
            params,
        )
        if row is None:
            return None
        pos, oid, ver, topic, state, prev, chain = row
        return ChainRow(pos, bytes.fromhex(oid), ver, topic, state, prev, chain)

    def predecessor(self, position: int) -> ChainRow | None:
        """The entry just before ``position`` (for a range that starts mid-journal)."""
        return self._one("WHERE rowid < ? ORDER BY rowid DESC LIMIT 1", (position,))

    def position_of_hash(self, chain_hash: bytes) -> int | None:
        row = self._fetchone(f"SELECT rowid FROM {TABLE} WHERE chain_hash = ?", (chain_hash,))
        return None if row is None else int(row[0])

    def head(self) -> tuple[int, bytes] | None:
        row = self._fetchone(_HEAD, ())
        return None if row is None else (int(row[0]), bytes(row[1]))

    @contextlib.contextmanager
    def side_tables(self, *, write: bool) -> Iterator[sqlite3.Cursor]:
        """One transaction on tables kept beside the journal in its file (the Merkle
        tree's), on a connection of its own: with ``write`` it takes the write lock
        first (``BEGIN IMMEDIATE``) and commits when the block ends cleanly, else it is
        a read snapshot. Rows are :class:`sqlite3.Row`; driver errors propagate (the
        caller says what could not be read or written). A read snapshot reuses the
        store's idle read connections (a fresh one per proof paid the connect and a cold
        page cache, ~1-3 ms at 1M leaves)."""
        if not write:
            with self._reading(translate=False) as conn, contextlib.closing(conn.cursor()) as cur:
                cur.row_factory = sqlite3.Row
                cur.execute("BEGIN")
                try:
                    yield cur
                finally:
                    conn.rollback()
            return
        conn = self._open(sqlite_uri(self.path, "rw"), readonly=False)
        conn.row_factory = sqlite3.Row
        try:
            cur = conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
        finally:
            conn.close()
