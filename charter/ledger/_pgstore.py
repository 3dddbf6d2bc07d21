"""The PostgreSQL journal store: raw reads, schema set-up and settling an ambiguous
commit, on the driver directly (no eventsourcing here). Every driver error of a read is
translated here, once."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL, Composed, Identifier, Literal

from charter.core.errors import StateError, UnavailableError
from charter.ledger._postgres import EVENTS_TABLE, batch_index_statements, schema_statements
from charter.ledger._rows import BATCHES_TABLE, ChainRow, JournalMeta, batch_runs

__all__ = ["PostgresJournalStore"]

_INIT_LOCK = 0x43686172746572  # "Charter": the advisory lock racing inits queue on


class PostgresJournalStore:
    """Raw reads and schema set-up for a PostgreSQL journal (no eventsourcing here).

    Every driver error that leaves a method is translated here, once, to the contract
    errors: a lost or refused connection is :class:`UnavailableError` (and the cached
    connection is dropped, so the next call connects afresh); a missing table is the
    :class:`StateError` "no Charter journal"."""

    def __init__(self, conninfo: dict[str, Any], schema: str = "public") -> None:
        self.conninfo = conninfo
        self.schema = schema
        self._conn: psycopg.Connection[Any] | None = None

    def _where(self) -> str:
        return (
            f"{self.conninfo.get('host')}:{self.conninfo.get('port')}/{self.conninfo.get('dbname')}"
        )

    def _open(
        self, *, connect_timeout: float = 5, autocommit: bool = True
    ) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(
                **self.conninfo, connect_timeout=max(1, int(connect_timeout)), autocommit=autocommit
            )
        except psycopg.Error as e:
            raise UnavailableError(
                f"cannot reach PostgreSQL at {self._where()}: {_first_line(e)}; check that "
                "the server is running and the URL is right"
            ) from None

    def connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self._open()
        return self._conn

    @contextlib.contextmanager
    def _driver_errors(self) -> Iterator[None]:
        """The one place a driver error of a read becomes a contract error."""
        try:
            yield
        except psycopg.errors.UndefinedTable:
            raise StateError(
                f"no Charter journal in PostgreSQL database {self.conninfo.get('dbname')!r}; "
                "run `charter init` to create one"
            ) from None
        except (psycopg.Error, OSError) as e:
            if self._conn is not None and (self._conn.broken or self._conn.closed):
                self._conn = None
            raise UnavailableError(
                f"PostgreSQL at {self._where()} failed a journal read "
                f"({type(e).__name__}: {_first_line(e)}); check the server and retry"
            ) from e

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None

    def _q(self, sql: str) -> Composed:
        return SQL(sql).format(schema=Identifier(self.schema), table=Identifier(EVENTS_TABLE))

    def read_meta(self) -> JournalMeta:
        where = f"PostgreSQL database {self.conninfo.get('dbname')!r}"
        rows = self._fetch(self._q("SELECT key, value FROM {schema}.charter_meta"), ())
        return JournalMeta.from_rows(dict(rows), where=where)

    def create_schema(self, meta: JournalMeta, *, reuse_empty: bool = False) -> None:
        """Tables, triggers and metadata in one transaction: all of it or none. Racing
        inits are serialised by a transaction-level advisory lock; the one that comes
        second finds the journal made and is refused (a StateError, nothing written)."""
        del reuse_empty  # a PostgreSQL schema is made all at once: never half-made
        with self._driver_errors():
            conn = self.connect()
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_INIT_LOCK,))
                made = conn.execute(
                    "SELECT to_regclass(%s)", (f"{self.schema}.charter_meta",)
                ).fetchone()
                if made is not None and made[0] is not None:
                    raise StateError(
                        f"PostgreSQL database {self.conninfo.get('dbname')!r} already holds a "
                        "Charter journal (another init made it meanwhile); refusing to "
                        "initialise it again"
                    )
                for statement in schema_statements(self.schema, EVENTS_TABLE):
                    conn.execute(statement)
                for key, value in meta.to_rows().items():
                    conn.execute(
                        self._q("INSERT INTO {schema}.charter_meta (key, value) VALUES (%s, %s)"),
                        (key, value),
                    )

    def has_batch_index(self) -> bool:
        """Whether the journal has its batch index (journals made before it do not)."""
        row = self._one_row(
            SQL("SELECT to_regclass({name})").format(
                name=Literal(f"{self.schema}.{BATCHES_TABLE}")
            ),
            (),
        )
        return row is not None and row[0] is not None

    def batch_range(self, batch: str) -> tuple[int, int] | None:
        """The positions one append wrote, by its id: one read of the index's key."""
        query = SQL(
            "SELECT first_position, last_position FROM {schema}.{batches} WHERE batch = %s"
        ).format(schema=Identifier(self.schema), batches=Identifier(BATCHES_TABLE))
        row = self._one_row(query, (batch,))
        return None if row is None else (int(row[0]), int(row[1]))

    def add_batch_index(self) -> int:
        """Make the batch index of a journal made before it, from the entries' stored
        ids, in one transaction holding the writers' table lock (no append lands between
        the read and the index); a no-op if another writer made it first. Returns the
        number of batches indexed."""
        batches = Identifier(BATCHES_TABLE)
        with self._driver_errors(), self._open(autocommit=False) as conn, conn.transaction():
            conn.execute(self._q("LOCK TABLE {schema}.{table} IN EXCLUSIVE MODE"))
            made = conn.execute(
                "SELECT to_regclass(%s)", (f"{self.schema}.{BATCHES_TABLE}",)
            ).fetchone()
            if made is not None and made[0] is not None:
                return 0
            for statement in batch_index_statements(self.schema, EVENTS_TABLE):
                conn.execute(statement)
            with conn.cursor(name="charter_batch_ids") as cur:
                cur.itersize = 10_000
                cur.execute(
                    self._q(
                        "SELECT notification_id, substring(state FROM 1 FOR 128) "
                        "FROM {schema}.{table} ORDER BY notification_id"
                    )
                )
                runs = batch_runs((int(pos), bytes(head)) for pos, head in cur)
            with conn.cursor() as cur:
                cur.executemany(
                    SQL(
                        "INSERT INTO {schema}.{batches} (batch, first_position, "
                        "last_position) VALUES (%s, %s, %s)"
                    ).format(schema=Identifier(self.schema), batches=batches),
                    runs,
                )
            return len(runs)

    def settle(
        self, backend_pid: int, keys: Sequence[tuple[bytes, int]], wait_s: float
    ) -> list[ChainRow | None] | None:
        """After a commit whose acknowledgement was lost: the rows stored under ``keys``
        (stream, version), read on a FRESH connection once the session that sent the
        COMMIT (``backend_pid``) has ended, so its transaction can no longer change
        what is read. None when that cannot be known within ``wait_s`` seconds (the
        server is unreachable, or the old session lingers)."""
        deadline = time.monotonic() + wait_s
        alive = self._q(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND pid <> pg_backend_pid() "
            "AND xact_start IS NOT NULL"
        )
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                with self._open(connect_timeout=min(left, 5)) as conn:
                    while conn.execute(alive, (backend_pid,)).fetchone() is not None:
                        if time.monotonic() >= deadline:
                            return None
                        time.sleep(0.05)
                    where = "WHERE originator_id = %s AND originator_version = %s"
                    found = []
                    for originator, version in keys:
                        r = conn.execute(self._select(where), (UUID(bytes=originator), version))
                        row = r.fetchone()
                        found.append(None if row is None else self._row(row))
                    return found
            except (UnavailableError, psycopg.Error, OSError):
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _select(self, where: str) -> Composed:
        return self._q(
            "SELECT notification_id, originator_id, originator_version, topic, state, "
            f"prev_hash, chain_hash FROM {{schema}}.{{table}} {where}"
        )

    @staticmethod
    def _row(r: Sequence[Any]) -> ChainRow:
        pos, oid, ver, topic, state, prev, chain = r
        return ChainRow(pos, oid.bytes, ver, topic, bytes(state), bytes(prev), bytes(chain))

    @staticmethod
    def originator_bytes(value: UUID) -> bytes:
        """Converts the stored originator column to its 16 raw bytes."""
        return value.bytes

    def batches(self, start: int | None = None, stop: int | None = None) -> Iterator[list[Any]]:
        """Raw row tuples in position order, in batches (see the SQLite store)."""
        conn = self._open(autocommit=False)
        try:
            with self._driver_errors(), conn.transaction(), conn.cursor(name="charter_rows") as cur:
                params = (
                    start if start is not None else -(2**63),
                    stop if stop is not None else 2**63 - 1,
                )
                where = "WHERE notification_id >= %s AND notification_id <= %s "
                cur.execute(self._select(where + "ORDER BY notification_id"), params)
                while batch := cur.fetchmany(10_000):
                    yield [
                        (p, o, v, t, bytes(s), bytes(pr), bytes(c))
                        for p, o, v, t, s, pr, c in batch
                    ]
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def payloads(self, start: int | None = None, stop: int | None = None) -> Iterator[list[Any]]:
        """``(position, topic, state)`` tuples in position order, in batches of at most
        10,000 (keyset pages on the store's one connection: bounded memory, and no new
        connection per call, which dominated a follower's lag)."""
        low = start if start is not None else -(2**63)
        high = stop if stop is not None else 2**63 - 1
        query = self._q(
            "SELECT notification_id, topic, state FROM {schema}.{table} "
            "WHERE notification_id >= %s AND notification_id <= %s "
            "ORDER BY notification_id LIMIT 10000"
        )
        while low <= high:
            page = self._fetch(query, (low, high))
            if not page:
                return
            yield [(pos, topic, bytes(state)) for pos, topic, state in page]
            if len(page) < 10_000:
                return
            low = page[-1][0] + 1

    def _one_row(self, query: Composed, params: tuple[Any, ...]) -> Any:
        return self._fetch(query, params, one=True)

    def _fetch(self, query: Composed, params: tuple[Any, ...], *, one: bool = False) -> Any:
        """One read on the cached connection; a connection found dead (the server
        restarted, the session was terminated) is replaced once, since reads repeat
        safely."""
        for attempt in (1, 2):
            try:
                with self._driver_errors():
                    cur = self.connect().execute(query, params)
                    return cur.fetchone() if one else cur.fetchall()
            except UnavailableError as e:
                lost = isinstance(e.__cause__, psycopg.OperationalError | psycopg.InterfaceError)
                if attempt == 2 or not lost or self._conn is not None:
                    raise
        raise UnavailableError("unreachable: the read loop returns or raises")

    def stream_versions(self, originators: Sequence[bytes]) -> dict[bytes, int]:
        """The last version of each stream that has one: one round trip for them all
        (a decision reads every stream of its chain; on a loaded host each round trip
        waits for two processes to be scheduled)."""
        if not originators:
            return {}
        # One MAX per stream, each a descent of the primary key's index (a MAX grouped
        # by stream reads every entry of each: a lease's stream grows with its usage).
        query = self._q(
            "SELECT ids.id, (SELECT MAX(originator_version) FROM {schema}.{table} "
            "WHERE originator_id = ids.id) FROM unnest(%s::uuid[]) AS ids(id)"
        )
        rows = self._fetch(query, ([UUID(bytes=o) for o in originators],))
        return {oid.bytes: int(version) for oid, version in rows if version is not None}

    def find(self, originator: bytes, version: int) -> ChainRow | None:
        """The entry of one stream version, if it is in the journal."""
        where = "WHERE originator_id = %s AND originator_version = %s"
        r = self._one_row(self._select(where), (UUID(bytes=originator), version))
        return None if r is None else self._row(r)

    def predecessor(self, position: int) -> ChainRow | None:
        where = "WHERE notification_id < %s ORDER BY notification_id DESC LIMIT 1"
        r = self._one_row(self._select(where), (position,))
        return None if r is None else self._row(r)

    def position_of_hash(self, chain_hash: bytes) -> int | None:
        query = self._q("SELECT notification_id FROM {schema}.{table} WHERE chain_hash = %s")
        r = self._one_row(query, (chain_hash,))
        return None if r is None else int(r[0])

    def head(self) -> tuple[int, bytes] | None:
        query = self._q(
            "SELECT notification_id, chain_hash FROM {schema}.{table} "
            "ORDER BY notification_id DESC LIMIT 1"
        )
        r = self._one_row(query, ())
        return None if r is None else (int(r[0]), bytes(r[1]))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
