"""SQLite driver code for the projection tables (in the journal's own file).

Why a driver import outside ``charter/ledger``: the design keeps the projections as SQL
tables in the same database as the journal, committed together with the follower's
tracking row; that transaction needs a connection of its own. Only the two private
store modules of this package import a driver, and only for that.

Writers take ``BEGIN IMMEDIATE`` (the write lock first; a deferred ``BEGIN`` would fail
across processes with "database is locked" when it upgrades). Readers see one WAL
snapshot for the statements of a read.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from charter.core.errors import UnavailableError
from charter.ledger import sqlite_uri
from charter.projections._store import ProjectionStore

__all__ = ["SQLiteProjectionStore"]


class SQLiteProjectionStore(ProjectionStore):
    def __init__(self, path: Path, prefix: str, tracking_name: str) -> None:
        super().__init__(prefix, tracking_name)
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._scratch = False

    @classmethod
    def scratch(cls, prefix: str, tracking_name: str) -> SQLiteProjectionStore:
        """Tables in a private temporary file, removed on close: for a reader that may
        not write the journal's file (an auditor), which folds from position 0."""
        fd, name = tempfile.mkstemp(prefix="charter-projection-", suffix=".db")
        os.close(fd)
        store = cls(Path(name), prefix, tracking_name)
        with store.write() as cur:  # the journal file's tracking table, here the scratch's
            cur.execute(
                f"CREATE TABLE {store.tracking_table} (application_name TEXT PRIMARY KEY, "
                "notification_id BIGINT NOT NULL)"
            )
        store._scratch = True
        return store

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                conn = sqlite3.connect(
                    sqlite_uri(self.path, "rw"), uri=True, isolation_level=None, timeout=30
                )
                # The journal keeps synchronous=FULL for its own commits; projection
                # rows are derived data, but their tracking row shares the commit, so
                # the same durability keeps "exactly once" true across power loss.
                conn.execute("PRAGMA synchronous=FULL")
                # A rebuild inserts into B-trees keyed by lineage, out of order; a
                # larger page cache (64 MiB, this connection only) keeps them in memory.
                conn.execute("PRAGMA cache_size=-65536")
            except sqlite3.Error as e:
                raise UnavailableError(f"cannot open SQLite journal {self.path}: {e}") from e
            self._conn = conn
        return self._conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Cursor]:
        cur = self._connection().cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise UnavailableError(f"cannot lock {self.path} for projection: {e}") from e
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Cursor]:
        cur = self._connection().cursor()
        cur.execute("BEGIN")
        try:
            yield cur
        finally:
            cur.execute("COMMIT")

    def table_exists(self, cur: sqlite3.Cursor, table: str) -> bool:
        cur.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
            (f"{self.prefix}_{table}",),
        )
        return cur.fetchone() is not None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._scratch:
            for suffix in ("", "-journal", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
