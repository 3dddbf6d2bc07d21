"""The PostgreSQL journal adapter: chained eventsourcing recorders, schema, raw reads.

Writers are serialised by the library's own ``LOCK TABLE … IN EXCLUSIVE MODE``; under
that lock the recorder reads the head, stamps the batch's commit time, assigns the
positions after the head (head + 1, …, so they are contiguous), computes the chain and
inserts. The chain links each entry to its predecessor row, never to ``id - 1``, so a
reader never depends on contiguity. The library's plpgsql insert function is never
created (it would skip the lock and the chain), and ``POSTGRES_ENABLE_DB_FUNCTIONS`` is
refused.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import (
    InterfaceError,
    OperationalError,
    ProgrammingError,
    StoredEvent,
)
from eventsourcing.postgres import (
    PostgresApplicationRecorder,
    PostgresFactory,
    PostgresProcessRecorder,
)
from eventsourcing.utils import retry
from psycopg.rows import DictRow
from psycopg.sql import SQL, Composed, Identifier

from charter.core.errors import StateError, UnavailableError
from charter.core.framing import GENESIS, entry_hash
from charter.ledger._rows import (
    ChainRow,
    CommitOutcomeAmbiguousError,
    Guards,
    Head,
    JournalMeta,
    LastCommit,
    WriteLockTimeoutError,
    check_guards,
    last_commit,
    set_last_commit,
    stamp_batch,
    stamp_of,
)

__all__ = [
    "ChainedPostgresFactory",
    "ChainedPostgresApplicationRecorder",
    "ChainedPostgresProcessRecorder",
    "PostgresJournalStore",
]

EVENTS_TABLE = "charter_events"
_ATTEMPTS = 3
_INIT_LOCK = 0x43686172746572  # "Charter": the advisory lock racing inits queue on
TRACKING_TABLE = "charter_tracking"


def _schema_statements(schema: str, table: str) -> list[Composed]:
    ids = {"schema": Identifier(schema), "table": Identifier(table)}
    fn = Identifier(f"{table}_append_only")
    return [
        SQL(
            "CREATE TABLE IF NOT EXISTS {schema}.{table} ("
            "originator_id uuid NOT NULL, "
            "originator_version bigint NOT NULL, "
            "topic text NOT NULL, "
            "state bytea NOT NULL, "
            "notification_id bigserial, "
            # a unique predecessor makes a fork impossible
            "prev_hash bytea NOT NULL UNIQUE CHECK (length(prev_hash) = 32), "
            "chain_hash bytea NOT NULL CHECK (length(chain_hash) = 32), "
            "PRIMARY KEY (originator_id, originator_version))"
        ).format(**ids),
        SQL(
            "CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {schema}.{table} (notification_id)"
        ).format(index=Identifier(f"{table}_notification_id_idx"), **ids),
        SQL(
            "CREATE OR REPLACE FUNCTION {schema}.{fn}() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'charter journal is append-only: % refused', TG_OP; END$$"
        ).format(fn=fn, **ids),
        SQL(
            "CREATE OR REPLACE TRIGGER {name} BEFORE UPDATE OR DELETE ON {schema}.{table} "
            "FOR EACH ROW EXECUTE FUNCTION {schema}.{fn}()"
        ).format(name=Identifier(f"{table}_no_change"), fn=fn, **ids),
        SQL(
            "CREATE OR REPLACE TRIGGER {name} BEFORE TRUNCATE ON {schema}.{table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION {schema}.{fn}()"
        ).format(name=Identifier(f"{table}_no_truncate"), fn=fn, **ids),
        # The library's single-row tracking table, already "migrated" (its marker row).
        SQL(
            "CREATE TABLE IF NOT EXISTS {schema}.{tracking} "
            "(application_name text PRIMARY KEY, notification_id bigint)"
        ).format(tracking=Identifier(TRACKING_TABLE), **ids),
        SQL("INSERT INTO {schema}.{tracking} VALUES ('__migration__', 1)").format(
            tracking=Identifier(TRACKING_TABLE), **ids
        ),
        SQL(
            "CREATE TABLE IF NOT EXISTS {schema}.charter_meta "
            "(key text PRIMARY KEY, value text NOT NULL)"
        ).format(**ids),
        SQL(
            "CREATE OR REPLACE TRIGGER charter_meta_write_once BEFORE UPDATE OR DELETE "
            "ON {schema}.charter_meta FOR EACH ROW EXECUTE FUNCTION {schema}.{fn}()"
        ).format(fn=fn, **ids),
    ]


@contextlib.contextmanager
def _timeouts_are_final() -> Iterator[None]:
    try:
        yield
    except OperationalError as e:
        if isinstance(e.__cause__, psycopg.errors.LockNotAvailable) or "lock timeout" in str(e):
            raise WriteLockTimeoutError(
                "another writer has held the journal's write lock for longer than the lock "
                "timeout (CHARTER_PG_LOCK_TIMEOUT, 30 s by default); it may be stalled"
            ) from e
        if isinstance(e.__cause__, psycopg.errors.QueryCanceled):
            raise WriteLockTimeoutError(
                "a journal statement ran past the statement timeout "
                "(CHARTER_PG_STATEMENT_TIMEOUT, 60 s by default); another writer may be "
                "stalled while holding the write lock"
            ) from e
        raise


class ChainedPostgresFactory(PostgresFactory):
    """The library's factory, plus what its datastore does not hand to the driver: the
    session's statement timeout (``POSTGRES_STATEMENT_TIMEOUT``, seconds) and the URL's
    own connection parameters such as ``sslmode`` (``POSTGRES_CONNINFO_EXTRA``, JSON),
    which would otherwise be dropped (a plaintext connection where psql would refuse)."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        extra: dict[str, str] = json.loads(self.env.get("POSTGRES_CONNINFO_EXTRA") or "{}")
        timeout = self.env.get("POSTGRES_STATEMENT_TIMEOUT")
        if timeout:
            ms = int(float(timeout) * 1000)
            # libpq's options: set for every session the pool opens, before any query.
            extra["options"] = f"{extra.get('options', '')} -c statement_timeout={ms}".strip()
        kwargs = self.datastore.pool.kwargs
        if not isinstance(kwargs, dict):  # fail closed: never connect without them
            raise StateError("the PostgreSQL pool's connection parameters cannot be extended")
        kwargs.update(extra)


class ChainedPostgresApplicationRecorder(PostgresApplicationRecorder):
    """Stock recorder plus the hash chain, computed under the library's table lock."""

    def __init__(self, datastore: Any, *, events_table_name: str = EVENTS_TABLE) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        if self.datastore.enable_db_functions:
            raise StateError(
                "POSTGRES_ENABLE_DB_FUNCTIONS is set: that insert path skips the table "
                "lock and the hash chain; unset it"
            )
        schema = self.datastore.schema
        table = self.events_table_name
        # Keep the library's composite type (its adapters expect it); replace the table
        # with the chained one and drop the plpgsql insert function.
        kept = [s for s in self.sql_create_statements if "CREATE TYPE" in s.as_string()]
        self.sql_create_statements = [*kept, *_schema_statements(schema, table)]
        ids = {"schema": Identifier(schema), "table": Identifier(table)}
        insert = (
            "INSERT INTO {schema}.{table} (notification_id, originator_id, "
            "originator_version, topic, state, prev_hash, chain_hash) "
            "SELECT * FROM unnest(%s::bigint[], %s::uuid[], %s::bigint[], %s::text[], "
            "%s::bytea[], %s::bytea[], %s::bytea[]) "
        )
        self._insert_chained = SQL(insert + "RETURNING notification_id").format(**ids)
        # The fast path: inserts only if the head is still the one this recorder
        # committed last (so no other writer came in between), in the same round trip
        # as the lock, like the stock recorder.
        self._insert_if_head = SQL(
            insert + "WHERE (SELECT chain_hash FROM {schema}.{table} "
            "ORDER BY notification_id DESC LIMIT 1) = %s RETURNING notification_id"
        ).format(**ids)
        # The head this recorder committed last; only a hint, checked by the database
        # under the table lock on every use.
        self._head_hint: Head | None = None
        # Whether other writers are appending too (the hint was found stale lately):
        # then the guarded insert would mostly miss and cost two more round trips under
        # the lock, so the head is read with the lock instead (one round trip).
        self._contended = False
        self._select_version = SQL(
            "SELECT MAX(originator_version) AS version FROM {schema}.{table} "
            "WHERE originator_id = %s"
        ).format(**ids)
        self._select_head = SQL(
            "SELECT notification_id, chain_hash, substring(state from 1 for 40) AS at "
            "FROM {schema}.{table} ORDER BY notification_id DESC LIMIT 1"
        ).format(**ids)

    # A pooled connection found dead (the server restarted, the session was
    # terminated) is replaced by the retry; three tries, not the library's ten, since
    # each waits up to the connect timeout and an unreachable server should be
    # reported in seconds, not a minute.
    @retry((InterfaceError, OperationalError), max_attempts=_ATTEMPTS, wait=0.2)
    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Any:
        """The library's pipelined insert, except that *any* failure rolls back, and a
        broken connection during the commit is reported as ambiguous, never retried.

        The stock method stores an exception raised inside its transaction block and
        re-raises it after the block has exited, which commits whatever was already
        executed. Here the exception leaves through ``psycopg.Rollback``, so a failure
        anywhere in the batch leaves nothing (shown by the mid-batch fault test).

        A connection failure inside the transaction block happens before the COMMIT
        is sent, so nothing committed and the insert is retried (as the library does). A
        connection that breaks while the COMMIT is in flight raises
        :class:`CommitOutcomeAmbiguousError` with the session's backend pid, which is
        never retried here: the journal settles it on a fresh connection (see
        ``PostgresJournalStore.settle``).
        """
        with _timeouts_are_final(), self.datastore.get_connection() as conn:
            return self._insert_on(conn, stored_events, **kwargs)

    @retry((InterfaceError, OperationalError), max_attempts=_ATTEMPTS, wait=0.2)
    def select_events(self, *args: Any, **kwargs: Any) -> Any:
        """The library's read, with the retries of :meth:`insert_events`."""
        return PostgresApplicationRecorder.select_events.__wrapped__(self, *args, **kwargs)

    def _insert_on(
        self, conn: psycopg.Connection[DictRow], stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Any:
        exc: Exception | None = None
        ids: Sequence[int] | None = None
        set_last_commit(None)
        hint, self._head_hint = self._head_hint, None  # only a committed head is a hint
        pid = conn.info.backend_pid
        committing = False
        try:
            with conn.pipeline() as pipeline, conn.transaction():
                with conn.cursor() as curs:
                    self._insert_events(curs, stored_events, **kwargs)  # tracking, if any
                if stored_events:
                    with conn.cursor() as curs:
                        try:
                            self._insert_stored_events(
                                curs,
                                stored_events,
                                guards=kwargs.get("guards") or (),
                                deadline_ms=kwargs.get("deadline_ms"),
                                hint=hint,
                            )
                            pipeline.sync()
                            ids = self._fetch_ids_after_insert_events(curs, stored_events)
                        except Exception as e:  # noqa: BLE001 - re-raised below, after rollback
                            exc = e
                            raise psycopg.Rollback from None
                committing = True  # leaving the block sends the COMMIT
        except psycopg.Rollback as e:  # not taken by its transaction: nothing committed
            raise exc or OperationalError(f"the journal transaction was rolled back: {e}") from e
        except (psycopg.Error, OSError) as e:
            # Raised on the way out of the block: the COMMIT was queued. If the session
            # is gone the server may have committed it or not; only a re-read can tell.
            if committing and (conn.broken or conn.closed):
                raise CommitOutcomeAmbiguousError(
                    f"the connection broke while the batch was committing: {e}",
                    backend_pid=pid,
                ) from e
            raise
        if exc is not None:
            raise exc
        commit = last_commit()
        if commit is not None and commit.positions:
            self._head_hint = Head(commit.positions[-1], commit.hashes[-1], commit.stamp)
        return ids

    def _insert_stored_events(
        self,
        curs: psycopg.Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        *,
        guards: Guards = (),
        deadline_ms: int | None = None,
        hint: Head | None = None,
        **kwargs: Any,
    ) -> None:
        """Under the library's table lock: stamp the batch's commit time, chain it onto
        the head and insert it. Positions are assigned here (head + 1, …) rather than
        drawn from the sequence, so they are contiguous.

        A batch with a deadline (or pinned streams) reads the head after the lock is
        taken (the read waits for it in the pipeline), so its time is read under the
        lock and the deadline is checked against the time it commits. Any other batch
        takes the fast path when this recorder committed the head last: stamped just
        before the lock, never earlier than that head, and inserted only if the head
        is still that one (checked by the database under the lock); otherwise
        :meth:`_fetch_ids_after_insert_events` chains it onto the real head, under the
        lock, in the same transaction.
        """
        del kwargs
        self._lock_table(curs)
        self._notify_channel(curs)
        check_guards(guards, lambda originator: self._stream_version(curs, originator))
        if hint is not None and deadline_ms is None and not guards and not self._contended:
            stamped, stamp = stamp_batch(stored_events, hint.stamp, None)
            self._insert_after(curs, hint, stamped, stamp, guarded=True)
            return
        head = self._read_head(curs)
        if hint is not None:  # alone again once the head is the one this writer left
            self._contended = head.hash != hint.hash
        stamped, stamp = stamp_batch(stored_events, head.stamp, deadline_ms)
        self._insert_after(curs, head, stamped, stamp)

    def _stream_version(self, curs: psycopg.Cursor[DictRow], originator: UUID) -> int:
        curs.execute(self._select_version, (originator,))
        row = curs.fetchone()
        return int(row["version"] or 0) if row else 0

    def _read_head(self, curs: psycopg.Cursor[DictRow]) -> Head:
        curs.execute(self._select_head)
        row = curs.fetchone()
        if row is None:
            return Head(0, GENESIS, None)
        return Head(row["notification_id"], bytes(row["chain_hash"]), stamp_of(bytes(row["at"])))

    def _insert_after(
        self,
        curs: psycopg.Cursor[DictRow],
        head: Head,
        stored_events: Sequence[StoredEvent],
        stamp: bytes,
        *,
        guarded: bool = False,
    ) -> None:
        position, prev = head.position, head.hash
        positions, oids, versions, topics, states, prevs, hashes = [], [], [], [], [], [], []
        for s in stored_events:
            position += 1
            oid = (
                s.originator_id if isinstance(s.originator_id, UUID) else UUID(str(s.originator_id))
            )
            h = entry_hash(
                prev, position, oid.bytes, s.originator_version, s.topic.encode(), s.state
            )
            positions.append(position)
            oids.append(oid)
            versions.append(s.originator_version)
            topics.append(s.topic)
            states.append(s.state)
            prevs.append(prev)
            hashes.append(h)
            prev = h
        columns = (positions, oids, versions, topics, states, prevs, hashes)
        if guarded:
            curs.execute(self._insert_if_head, (*columns, head.hash))
        else:
            curs.execute(self._insert_chained, columns)
        set_last_commit(LastCommit(tuple(positions), tuple(hashes), stamp))

    def _fetch_ids_after_insert_events(
        self, curs: psycopg.Cursor[DictRow], stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        del kwargs
        inserted = curs.fetchall()
        if len(inserted) != len(stored_events):
            # The hint was stale (another writer appended): still under the lock, chain
            # onto the real head and stamp again, in the same transaction.
            self._contended = True
            head = self._read_head(curs)
            stamped, stamp = stamp_batch(stored_events, head.stamp, None)
            self._insert_after(curs, head, stamped, stamp)
            inserted = curs.fetchall()
        commit = last_commit()
        if commit is None or [r["notification_id"] for r in inserted] != list(commit.positions):
            raise ProgrammingError("journal insert did not return the positions it chained")
        return list(commit.positions)


class ChainedPostgresProcessRecorder(PostgresProcessRecorder, ChainedPostgresApplicationRecorder):
    """Tracking position, new events and their chain in one transaction (followers)."""

    @retry((InterfaceError, OperationalError), max_attempts=_ATTEMPTS, wait=0.2)
    def max_tracking_id(self, application_name: str) -> int | None:
        """The library's read, with the retries of :meth:`insert_events`."""
        return PostgresProcessRecorder.max_tracking_id.__wrapped__(self, application_name)  # type: ignore[no-any-return]

    def __init__(
        self,
        datastore: Any,
        *,
        events_table_name: str = EVENTS_TABLE,
        tracking_table_name: str = TRACKING_TABLE,
    ) -> None:
        super().__init__(
            datastore, events_table_name=events_table_name, tracking_table_name=tracking_table_name
        )


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
                for statement in _schema_statements(self.schema, EVENTS_TABLE):
                    conn.execute(statement)
                for key, value in meta.to_rows().items():
                    conn.execute(
                        self._q("INSERT INTO {schema}.charter_meta (key, value) VALUES (%s, %s)"),
                        (key, value),
                    )

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
