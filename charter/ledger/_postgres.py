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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    PersistenceError,
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
from psycopg.sql import SQL, Composed, Identifier, Literal

from charter.core.clock import now_ms
from charter.core.errors import StateError
from charter.core.framing import ENTRY_TAG, GENESIS, entry_hash
from charter.ledger._group import Batch, SharedCommit, SpoolClosingFactory, private_place
from charter.ledger._rows import (
    BATCHES_TABLE,
    CommitOutcomeAmbiguousError,
    Guards,
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

__all__ = [
    "ChainedPostgresFactory",
    "ChainedPostgresApplicationRecorder",
    "ChainedPostgresProcessRecorder",
    "EVENTS_TABLE",
    "batch_index_statements",
    "schema_statements",
]

EVENTS_TABLE = "charter_events"
_ATTEMPTS = 3
TRACKING_TABLE = "charter_tracking"


def schema_statements(schema: str, table: str) -> list[Composed]:
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
        *batch_index_statements(schema, table),
        SQL(
            "CREATE TABLE IF NOT EXISTS {schema}.charter_meta "
            "(key text PRIMARY KEY, value text NOT NULL)"
        ).format(**ids),
        SQL(
            "CREATE OR REPLACE TRIGGER charter_meta_write_once BEFORE UPDATE OR DELETE "
            "ON {schema}.charter_meta FOR EACH ROW EXECUTE FUNCTION {schema}.{fn}()"
        ).format(fn=fn, **ids),
    ]


def batch_index_statements(schema: str, table: str) -> list[Composed]:
    """The batch index (BATCHES_TABLE in _rows), append-only like the journal (the
    events table's trigger function refuses UPDATE, DELETE and TRUNCATE)."""
    ids = {
        "schema": Identifier(schema),
        "batches": Identifier(BATCHES_TABLE),
        "fn": Identifier(f"{table}_append_only"),
    }
    return [
        SQL(
            "CREATE TABLE IF NOT EXISTS {schema}.{batches} ("
            "batch text PRIMARY KEY, "
            "first_position bigint NOT NULL, "
            "last_position bigint NOT NULL CHECK (last_position >= first_position))"
        ).format(**ids),
        SQL(
            "CREATE OR REPLACE TRIGGER {name} BEFORE UPDATE OR DELETE ON {schema}.{batches} "
            "FOR EACH ROW EXECUTE FUNCTION {schema}.{fn}()"
        ).format(name=Identifier(f"{BATCHES_TABLE}_no_change"), **ids),
        SQL(
            "CREATE OR REPLACE TRIGGER {name} BEFORE TRUNCATE ON {schema}.{batches} "
            "FOR EACH STATEMENT EXECUTE FUNCTION {schema}.{fn}()"
        ).format(name=Identifier(f"{BATCHES_TABLE}_no_truncate"), **ids),
    ]


# The chain computed by the database (see ChainedPostgresApplicationRecorder): the head
# (or the genesis), the batch's commit time (never earlier than the head's), then each
# entry framed as charter.core.framing.entry_frame does and hashed with sha256, in order.
_SERVER_CHAINED = """
WITH RECURSIVE
head AS (
    SELECT notification_id AS pos, chain_hash AS hash, substring(state FROM 8 FOR 32) AS at
    FROM {schema}.{table} ORDER BY notification_id DESC LIMIT 1
),
start AS (
    SELECT coalesce((SELECT pos FROM head), 0) AS pos,
           coalesce((SELECT hash FROM head), {genesis}::bytea) AS hash,
           greatest(%s::bytea, (SELECT at FROM head)) AS at
),
batch AS (
    SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::bytea[])
        WITH ORDINALITY AS b (oid, version, topic, state, i)
),
chain (i, pos, prev, hash, state) AS (
    SELECT 0::bigint, start.pos, NULL::bytea, start.hash, NULL::bytea FROM start
    UNION ALL
    SELECT b.i, c.pos + 1, c.hash,
           sha256(
               {tag}::bytea || c.hash || int8send(c.pos + 1) || '\\x0010'::bytea
               || uuid_send(b.oid) || int8send(b.version)
               || int4send(octet_length(convert_to(b.topic, 'UTF8')))
               || convert_to(b.topic, 'UTF8') || int4send(length(s.state)) || s.state
           ),
           s.state
    FROM chain c
    JOIN batch b ON b.i = c.i + 1
    CROSS JOIN LATERAL (
        SELECT overlay(b.state PLACING (SELECT at FROM start) FROM 8 FOR 32) AS state
    ) s
),
inserted AS (
    INSERT INTO {schema}.{table} (notification_id, originator_id, originator_version,
                                  topic, state, prev_hash, chain_hash)
    SELECT c.pos, b.oid, b.version, b.topic, c.state, c.prev, c.hash
    FROM chain c JOIN batch b ON b.i = c.i
    WHERE c.i > 0
    ORDER BY c.i
    RETURNING notification_id, chain_hash, substring(state FROM 8 FOR 32) AS at
),
indexed AS (
    -- the batch index row, in the same statement: an id already there is refused
    INSERT INTO {schema}.{batches} (batch, first_position, last_position)
    SELECT %s::text, min(notification_id), max(notification_id) FROM inserted
    HAVING %s::text IS NOT NULL AND count(*) > 0
)
SELECT notification_id, chain_hash, at FROM inserted
"""


def _roll_back(conn: psycopg.Connection[DictRow]) -> None:
    """End a failed transaction begun by hand. ``Connection.rollback`` also leaves a
    pipeline's aborted state and forgets the statements psycopg had queued for preparing
    (the server skipped them after the failure: "prepared statement _pg3_N does not
    exist" otherwise). A failure here is the connection's; the error that led here is
    the one raised."""
    if not (conn.broken or conn.closed):
        with contextlib.suppress(psycopg.Error):
            conn.rollback()


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


class ChainedPostgresFactory(SpoolClosingFactory, PostgresFactory):
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


class ChainedPostgresApplicationRecorder(SharedCommit, PostgresApplicationRecorder):
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
        self.sql_create_statements = [*kept, *schema_statements(schema, table)]
        ids = {"schema": Identifier(schema), "table": Identifier(table)}
        insert = (
            "INSERT INTO {schema}.{table} (notification_id, originator_id, "
            "originator_version, topic, state, prev_hash, chain_hash) "
            "SELECT * FROM unnest(%s::bigint[], %s::uuid[], %s::bigint[], %s::text[], "
            "%s::bytea[], %s::bytea[], %s::bytea[]) "
        )
        self._insert_chained = SQL(insert).format(**ids)
        # The chain computed by the database, under the table lock, in the statement
        # that inserts: the batch goes out with BEGIN, the lock and COMMIT in one
        # flight, and no round trip to this process happens while the lock is held.
        # The frame is ``entry_frame`` (charter/core/framing.py) spelled in SQL; a
        # difference would fail verification, which recomputes it in Python.
        self._insert_server_chained = SQL(_SERVER_CHAINED).format(
            tag=Literal(ENTRY_TAG),
            genesis=Literal(GENESIS),
            batches=Identifier(BATCHES_TABLE),
            **ids,
        )
        self._index_batch = SQL(
            "INSERT INTO {schema}.{batches} (batch, first_position, last_position) "
            "VALUES (%s, %s, %s)"
        ).format(schema=Identifier(schema), batches=Identifier(BATCHES_TABLE))
        self._select_versions = SQL(
            "SELECT originator_id, MAX(originator_version) AS version FROM {schema}.{table} "
            "WHERE originator_id = ANY(%s::uuid[]) GROUP BY originator_id"
        ).format(**ids)
        self._select_between = SQL(
            "SELECT notification_id, originator_id, originator_version, chain_hash AS chain "
            "FROM {schema}.{table} WHERE notification_id BETWEEN %s AND %s "
            "ORDER BY notification_id"
        ).format(**ids)
        self._select_entry = SQL(
            "SELECT notification_id, chain_hash, state FROM {schema}.{table} "
            "WHERE originator_id = %s AND originator_version = %s"
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

        Writers on one host share commits through the writers' turn and spool (group
        commit, decision 0008: :class:`SharedCommit`, :meth:`_commit_group`); without a
        private place for them, each batch commits alone.
        """
        with _timeouts_are_final():
            if not self.group_commit:  # CHARTER_GROUP_COMMIT=off: no turn, no spool
                return self._insert_alone(Batch(tuple(stored_events), kwargs))
            if self._shared():
                return self._insert_shared(stored_events, kwargs)
            with self.datastore.get_connection() as conn:
                return self._insert_on(conn, stored_events, **kwargs)

    _place: Path | None = None
    _no_place: str | None = None  # why there is no private place (each batch alone)

    def _shared(self) -> bool:
        if self._place is None and self._no_place is None:
            kw = self.datastore.pool.kwargs
            if not isinstance(kw, dict):
                kw = {}
            identity = "/".join(
                str(part)
                for part in (
                    kw.get("host"),
                    kw.get("port"),
                    kw.get("dbname"),
                    kw.get("user"),
                    self.datastore.schema,
                    self.events_table_name,
                )
            )
            try:
                self._place = private_place(identity)
            except OSError as e:
                self._no_place = str(e)  # no private place: every batch commits alone
        return self._place is not None

    def _spool_place(self) -> Path:
        if not self._shared() or self._place is None:
            raise OSError(f"no private place for the writers' turn and spool: {self._no_place}")
        return self._place

    def _lock_timeout_s(self) -> float:
        return float(self.datastore.lock_timeout or 30)

    def _entries_between(self, first: int, last: int) -> list[tuple[int, UUID, int, bytes]]:
        with self.datastore.get_connection() as conn:
            rows = conn.execute(self._select_between, (first, last)).fetchall()
        return [
            (
                r["notification_id"],
                r["originator_id"],
                r["originator_version"],
                bytes(r["chain"]),
            )
            for r in rows
        ]

    def _entries_of(
        self, keys: Sequence[tuple[UUID, int]]
    ) -> list[tuple[int, bytes, bytes] | None]:
        found: list[tuple[int, bytes, bytes] | None] = []
        with self.datastore.get_connection() as conn:
            for originator, version in keys:
                r = conn.execute(self._select_entry, (originator, version)).fetchone()
                found.append(
                    None
                    if r is None
                    else (int(r["notification_id"]), bytes(r["chain_hash"]), bytes(r["state"]))
                )
        return found

    def _commit_group(
        self, own: Batch, waiting: list[Claimed], hint: Head | None
    ) -> LastCommit | Exception:
        """One transaction for ``own`` and the waiting batches (a lone batch: the usual
        one flight). All of them go out in one flight; if the database or a check
        refuses one, the transaction is rolled back and the group is committed again
        one savepoint per batch, so the refused batch is refused alone. ``own``'s
        failure is raised; the waiting writers are answered after the commit."""
        del hint  # the database reads its head in the inserting statement
        with self.datastore.get_connection() as conn:
            if not waiting:
                self._insert_on(conn, own.events, **own.kwargs)
                if not own.events:  # a follower's position alone: no entry, no chain
                    return LastCommit((), (), b"")
                commit = last_commit()
                if commit is None:
                    raise ProgrammingError("the recorder did not report the committed chain")
                return commit
            batches = [own, *(Batch.waiting(claimed.request) for claimed in waiting)]
            try:
                outcomes = self._insert_group(conn, batches, isolated=False)
            except _RefusedError:
                outcomes = self._insert_group(conn, batches, isolated=True)
        self._reply(waiting, outcomes[1:])
        if isinstance(outcomes[0], Exception):
            raise outcomes[0]
        return outcomes[0]

    def _insert_group(
        self, conn: psycopg.Connection[DictRow], batches: Sequence[Batch], *, isolated: bool
    ) -> list[LastCommit | Exception]:
        """The batches in one transaction: pipelined (any refusal raises
        :class:`_RefusedError`, nothing written), or ``isolated``, each in a savepoint of
        its own (a refused batch's outcome is its error)."""
        set_last_commit(None)
        pid = conn.info.backend_pid
        committing = False
        chained: list[psycopg.Cursor[DictRow] | LastCommit | Exception] = []
        try:
            with contextlib.ExitStack() as stack:
                if not isolated:
                    stack.enter_context(conn.pipeline())
                curs = stack.enter_context(conn.cursor())
                curs.execute("BEGIN")
                self._lock_table(curs)  # once for the group
                self._notify_channel(curs)
                for batch in batches:
                    chained.append(self._insert_batch(curs, batch, isolated=isolated))
                committing = True
                curs.execute("COMMIT")
        except (psycopg.Error, OSError, PersistenceError) as e:
            if committing and (conn.broken or conn.closed):
                raise CommitOutcomeAmbiguousError(
                    f"the connection broke while a group of batches was committing: {e}",
                    backend_pid=pid,
                ) from e
            _roll_back(conn)
            if not isolated and _is_refusal(e):
                raise _RefusedError from e
            raise
        outcomes: list[LastCommit | Exception] = []
        for batch, done in zip(batches, chained, strict=True):
            if isinstance(done, psycopg.Cursor):
                self._fetch_ids_after_insert_events(done, batch.events)
                commit = last_commit()
                assert commit is not None
                outcomes.append(commit)
            else:
                outcomes.append(done)
        return outcomes

    def _insert_batch(
        self, curs: psycopg.Cursor[DictRow], batch: Batch, *, isolated: bool
    ) -> psycopg.Cursor[DictRow] | LastCommit | Exception:
        """One batch of a group: the cursor whose rows the database chained, the chain
        computed here, or (``isolated``) the error that refused it."""
        if isolated:
            curs.execute("SAVEPOINT charter_batch")
        try:
            self._insert_events(curs, batch.events, **batch.kwargs)  # tracking, if any
            if not batch.events:  # a follower's position alone: no entry, no chain
                if isolated:
                    curs.execute("RELEASE SAVEPOINT charter_batch")
                return LastCommit((), (), b"")
            rows = self._insert_stored_events(
                curs,
                batch.events,
                guards=batch.guards(),
                deadline_ms=batch.kwargs.get("deadline_ms"),
                expect_head=batch.kwargs.get("expect_head"),
                not_before_ms=batch.kwargs.get("not_before_ms"),
                locked=True,
            )
            if rows is not None and isolated:  # read now: the next batch reads the head
                self._fetch_ids_after_insert_events(rows, batch.events)
                rows = None
            done: psycopg.Cursor[DictRow] | LastCommit | Exception
            done = rows if rows is not None else _reported()
        except (psycopg.Error, PersistenceError) as e:
            if not (isolated and _is_refusal(e)):
                raise
            curs.execute("ROLLBACK TO SAVEPOINT charter_batch")
            done = e if isinstance(e, PersistenceError) else IntegrityError(e)
        if isolated:
            curs.execute("RELEASE SAVEPOINT charter_batch")
        return done

    @retry((InterfaceError, OperationalError), max_attempts=_ATTEMPTS, wait=0.2)
    def select_events(self, *args: Any, **kwargs: Any) -> Any:
        """The library's read, with the retries of :meth:`insert_events`."""
        return PostgresApplicationRecorder.select_events.__wrapped__(self, *args, **kwargs)

    def _insert_on(
        self, conn: psycopg.Connection[DictRow], stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Any:
        """One transaction, pipelined, with BEGIN and COMMIT sent by hand: psycopg's own
        transaction block syncs the pipeline before its COMMIT, one more round trip with
        the table lock held (five round trips per commit instead of two or three)."""
        ids: Sequence[int] | None = None
        set_last_commit(None)
        pid = conn.info.backend_pid
        committing = False
        try:
            with conn.pipeline(), conn.cursor() as curs:
                curs.execute("BEGIN")
                try:
                    self._insert_events(curs, stored_events, **kwargs)  # tracking, if any
                    rows: psycopg.Cursor[DictRow] | None = None
                    if stored_events:
                        rows = self._insert_stored_events(
                            curs,
                            stored_events,
                            guards=kwargs.get("guards") or (),
                            deadline_ms=kwargs.get("deadline_ms"),
                            expect_head=kwargs.get("expect_head"),
                            not_before_ms=kwargs.get("not_before_ms"),
                        )
                    committing = True  # the COMMIT goes out with what is still in flight
                    curs.execute("COMMIT")
                except BaseException:
                    _roll_back(conn)
                    raise
                # leaving the pipeline syncs it: the one round trip of the COMMIT
            if stored_events:
                ids = self._fetch_ids_after_insert_events(rows, stored_events)
        except (psycopg.Error, OSError) as e:
            # The COMMIT was in flight. If the session is gone the server may have
            # committed it or not; only a re-read can tell.
            if committing and (conn.broken or conn.closed):
                raise CommitOutcomeAmbiguousError(
                    f"the connection broke while the batch was committing: {e}",
                    backend_pid=pid,
                ) from e
            if committing:  # refused in flight (the COMMIT was skipped): end it here
                _roll_back(conn)
            raise
        return ids

    def _insert_stored_events(  # type: ignore[override]
        self,
        curs: psycopg.Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        *,
        guards: Guards = (),
        deadline_ms: int | None = None,
        expect_head: int | None = None,
        not_before_ms: int | None = None,
        locked: bool = False,
        **kwargs: Any,
    ) -> psycopg.Cursor[DictRow] | None:
        """Under the library's table lock: stamp the batch's commit time, chain it onto
        the head and insert it. Positions are assigned here (head + 1, …) rather than
        drawn from the sequence, so they are contiguous.

        A batch without a deadline or pinned streams (most) is chained by the database
        itself, in the inserting statement: stamped just before the lock, never earlier
        than the head's time (``greatest``), and sent with the lock and the COMMIT, so
        the lock is never held across a round trip to this process. A batch with a
        deadline (or pinned streams) reads the head after the lock is taken (the read
        waits for it in the pipeline), so its time is read under the lock and the
        deadline is checked against the time it commits, then is chained here. So is a
        batch pinned to the head (``expect_head``, ``not_before_ms``): the head it
        checks is read under the lock, in this transaction (a group's earlier batches
        included).

        Returns the cursor whose rows the database chained (read after the commit), or
        None if the chain was computed here (see ``last_commit``).
        """
        del kwargs
        if not locked:  # (a group takes the lock and notifies once)
            self._lock_table(curs)
            self._notify_channel(curs)
        if deadline_ms is None and not guards and expect_head is None and not_before_ms is None:
            return self._insert_on_server(curs, stored_events)
        versions, head = self._guards_and_head(curs, guards)
        check_guards(guards, lambda originator: versions.get(originator, 0))
        check_head(expect_head, head.position)
        stamped, stamp = stamp_batch(stored_events, head.stamp, deadline_ms, not_before_ms)
        self._insert_after(curs, head, stamped, stamp)
        return None

    def _insert_on_server(
        self, curs: psycopg.Cursor[DictRow], stored_events: Sequence[StoredEvent]
    ) -> psycopg.Cursor[DictRow]:
        """Queue the server-chained insert on a cursor of its own (its rows are read
        after the COMMIT has been sent with it)."""
        stamped, stamp = stamp_batch(stored_events, None, None)  # checks the states' shape
        batch = batch_of(stamped)
        rows = curs.connection.cursor()
        rows.execute(
            self._insert_server_chained,
            (
                stamp,
                [s.originator_id for s in stamped],
                [s.originator_version for s in stamped],
                [s.topic for s in stamped],
                [s.state for s in stamped],
                batch,
                batch,
            ),
        )
        return rows

    def barrier_ms(self) -> int:
        """A commit time no later entry a decision depends on can precede: the table
        lock is taken (whoever held it has committed or rolled back), the clock is
        read under it, and the lock is given back. Batches with a deadline or pinned
        streams (every budget and authority decision) are stamped under the lock, so
        each that has not committed by then is stamped after it."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute("BEGIN")
            try:
                self._lock_table(curs)
                return now_ms()
            finally:
                conn.rollback()

    def _guards_and_head(
        self, curs: psycopg.Cursor[DictRow], guards: Guards
    ) -> tuple[dict[UUID, int], Head]:
        """Under the lock, in one flight (one round trip in a pipeline, however many
        streams are pinned): the pinned streams' versions and the head. Each round trip
        with the lock held waits, on a loaded host, for this process and the server's
        to be scheduled, and every other writer waits behind it."""
        versions = None
        if guards:
            versions = curs.connection.cursor()
            versions.execute(self._select_versions, ([originator for originator, _ in guards],))
        head = self._read_head(curs)  # its fetch syncs the pipeline: both answered
        found = {} if versions is None else {
            r["originator_id"]: int(r["version"]) for r in versions.fetchall()
        }  # fmt: skip
        return found, head

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
        curs.execute(self._insert_chained, columns)
        batch = batch_of(stored_events)
        if batch is not None and positions:  # same transaction, under the table lock
            curs.execute(self._index_batch, (batch, positions[0], positions[-1]))
        set_last_commit(LastCommit(tuple(positions), tuple(hashes), stamp))

    def _fetch_ids_after_insert_events(  # type: ignore[override]
        self,
        rows: psycopg.Cursor[DictRow] | None,
        stored_events: Sequence[StoredEvent],
    ) -> Sequence[int] | None:
        """After the commit: the positions chained, here (``last_commit``) or by the
        database (the rows its insert returned, which become ``last_commit``)."""
        if rows is not None:
            chained = sorted(
                (r["notification_id"], bytes(r["chain_hash"]), bytes(r["at"]))
                for r in rows.fetchall()
            )
            stamps = {at for _, _, at in chained}
            if len(chained) != len(stored_events) or len(stamps) != 1:
                raise ProgrammingError("the database did not chain every event of the batch")
            set_last_commit(
                LastCommit(
                    tuple(p for p, _, _ in chained), tuple(h for _, h, _ in chained), stamps.pop()
                )
            )
        commit = last_commit()
        if commit is None or len(commit.positions) != len(stored_events):
            raise ProgrammingError("journal insert did not chain every event")
        return list(commit.positions)


class _RefusedError(Exception):
    """A batch of a pipelined group was refused: commit the group again, isolated."""


def _is_refusal(e: BaseException) -> bool:
    """A batch's own refusal (a conflict, a moved pin, a passed deadline), not a
    failure of the connection or the server."""
    return isinstance(e, psycopg.errors.IntegrityError | IntegrityError)


def _reported() -> LastCommit:
    commit = last_commit()
    if commit is None:
        raise ProgrammingError("the recorder did not report the committed chain")
    return commit


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
