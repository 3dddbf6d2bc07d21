"""PostgreSQL driver code for the projection tables (in the journal's database).

Why a driver import outside ``charter/ledger``: see ``_sqlite``. Writers of one prefix
are serialised by a transaction-scoped advisory lock (readers are never blocked: the
rows are versioned, and a rebuild replaces them inside one transaction).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg

from charter.core.errors import UnavailableError
from charter.projections._store import ProjectionStore

__all__ = ["PostgresProjectionStore"]


class PostgresProjectionStore(ProjectionStore):
    tracking_table = "charter_tracking"

    def __init__(self, conninfo: Mapping[str, Any], prefix: str, tracking_name: str) -> None:
        super().__init__(prefix, tracking_name)
        self.conninfo = dict(conninfo)
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(**self.conninfo, connect_timeout=5, autocommit=True)
            except psycopg.OperationalError as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise UnavailableError(
                    f"cannot reach PostgreSQL for projections: {first}"
                ) from None
        return self._conn

    def _q(self, sql: str) -> str:
        return sql.replace("?", "%s")

    @contextmanager
    def write(self) -> Iterator[psycopg.Cursor[Any]]:
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.tracking_name,))
            yield cur

    @contextmanager
    def read(self) -> Iterator[psycopg.Cursor[Any]]:
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            yield cur

    def table_exists(self, cur: psycopg.Cursor[Any], table: str) -> bool:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{self.prefix}_{table}",))
        row = cur.fetchone()
        return bool(row is not None and row[0])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
