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

from charter.core.errors import StateError
from charter.core.framing import GENESIS, entry_hash
from charter.ledger._rows import (
    CommitOutcomeAmbiguousError,
    Guards,
    Head,
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
    "EVENTS_TABLE",
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
        SQL(
            "CREATE TABLE IF NOT EXISTS {schema}.charter_meta "
            "(key text PRIMARY KEY, value text NOT NULL)"
        ).format(**ids),
        SQL(
            "CREATE OR REPLACE TRIGGER charter_meta_write_once BEFORE UPDATE OR DELETE "
            "ON {schema}.charter_meta FOR EACH ROW EXECUTE FUNCTION {schema}.{fn}()"
        ).format(fn=fn, **ids),
    ]


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
        self.sql_create_statements = [*kept, *schema_statements(schema, table)]
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
        """One transaction, pipelined, with BEGIN and COMMIT sent by hand: psycopg's own
        transaction block syncs the pipeline before its COMMIT, one more round trip with
        the table lock held (five round trips per commit instead of two or three)."""
        ids: Sequence[int] | None = None
        set_last_commit(None)
        hint, self._head_hint = self._head_hint, None  # only a committed head is a hint
        pid = conn.info.backend_pid
        committing = False
        try:
            with conn.pipeline(), conn.cursor() as curs:
                curs.execute("BEGIN")
                try:
                    self._insert_events(curs, stored_events, **kwargs)  # tracking, if any
                    if stored_events:
                        guarded = self._insert_stored_events(
                            curs,
                            stored_events,
                            guards=kwargs.get("guards") or (),
                            deadline_ms=kwargs.get("deadline_ms"),
                            hint=hint,
                        )
                        # A guarded insert is looked at before the commit (it may have
                        # found another head); a chained one commits in the same flight.
                        ids = self._fetch_ids_after_insert_events(curs, stored_events, guarded)
                    committing = True  # the COMMIT goes out with what is still in flight
                    curs.execute("COMMIT")
                except BaseException:
                    _roll_back(conn)
                    raise
                # leaving the pipeline syncs it: the one round trip of the COMMIT
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
        commit = last_commit()
        if commit is not None and commit.positions:
            self._head_hint = Head(commit.positions[-1], commit.hashes[-1], commit.stamp)
        return ids

    def _insert_stored_events(  # type: ignore[override]
        self,
        curs: psycopg.Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        *,
        guards: Guards = (),
        deadline_ms: int | None = None,
        hint: Head | None = None,
        **kwargs: Any,
    ) -> bool:
        """Under the library's table lock: stamp the batch's commit time, chain it onto
        the head and insert it; True if the insert is guarded by the head hint (and
        must be looked at before the commit). Positions are assigned here (head + 1, …) rather than
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
            return True
        head = self._read_head(curs)
        if hint is not None:  # alone again once the head is the one this writer left
            self._contended = head.hash != hint.hash
        stamped, stamp = stamp_batch(stored_events, head.stamp, deadline_ms)
        self._insert_after(curs, head, stamped, stamp)
        return False

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

    def _fetch_ids_after_insert_events(  # type: ignore[override]
        self,
        curs: psycopg.Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        guarded: bool = False,
    ) -> Sequence[int] | None:
        """The positions chained. A guarded insert that inserted nothing found another
        head (the hint was stale): still under the lock, chain onto the real head and
        stamp again, in the same transaction."""
        if guarded and len(curs.fetchall()) != len(stored_events):
            self._contended = True
            head = self._read_head(curs)
            stamped, stamp = stamp_batch(stored_events, head.stamp, None)
            self._insert_after(curs, head, stamped, stamp)
        commit = last_commit()
        if commit is None or len(commit.positions) != len(stored_events):
            raise ProgrammingError("journal insert did not chain every event")
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
