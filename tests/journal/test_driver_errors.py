"""Every driver error is translated once, in the store, to the contract's errors: each
failure is provoked for real (a terminated session, a refused connection, a lock held
by another connection, a file that is not a database) and must surface as a Charter
error (or be recovered from), never as a raw psycopg or sqlite3 exception."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest

from charter.core import StateError, UnavailableError
from charter.ledger import AppendFailedError, Journal
from tests.journal._proxy import CommitCuttingProxy
from tests.journal._support import Ping


def _admin(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(url, autocommit=True)


def _terminate_others(url: str) -> int:
    """pg_terminate_backend every other session on the test's database."""
    dbname = urlparse(url).path.lstrip("/")
    with _admin(url) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        ).fetchall()
    return len(rows)


@pytest.mark.postgres
def test_terminated_sessions_are_reconnected_for_appends_and_reads(pg_url: str) -> None:
    Journal.create(pg_url).close()
    with Journal.open(pg_url) as journal:
        journal.append([Ping(writer="w", batch=0, n=0)])
        assert journal.head() is not None  # the store's cached connection is open
        assert _terminate_others(pg_url) >= 2  # the pool's and the store's (AdminShutdown)
        # Both paths find their connection dead and connect afresh: no raw driver error.
        committed = journal.append([Ping(writer="w", batch=1, n=0)])
        assert journal.head() == (committed[0].position, committed[0].hash)
        assert journal.stream_version("counter:none") == 0


@pytest.mark.postgres
def test_a_refused_server_is_append_failed_and_unavailable(pg_url: str) -> None:
    Journal.create(pg_url).close()
    u = urlparse(pg_url)
    proxy = CommitCuttingProxy((u.hostname or "127.0.0.1", u.port or 5432))
    # A short connect timeout keeps the three tries of each call to a few seconds.
    journal = Journal.open(proxy.url(u.path.lstrip("/")), env={"POSTGRES_CONNECT_TIMEOUT": "1"})
    try:
        journal.append([Ping(writer="w", batch=0, n=0)])  # positive control: it works
        proxy.close()  # every connection dropped, new ones refused (OperationalError)
        with pytest.raises(AppendFailedError) as failed:
            journal.append([Ping(writer="w", batch=1, n=0)])
        assert not isinstance(failed.value.__cause__, psycopg.Error)  # translated once
        with pytest.raises(UnavailableError):
            journal.head()
        with pytest.raises(UnavailableError):
            journal.stream_version("counter:x")
    finally:
        journal.close()
    with Journal.open(pg_url) as direct:  # nothing of the failed batch was written
        assert [e.event.batch for e in direct.entries() if isinstance(e.event, Ping)] == [0]


@pytest.mark.postgres
def test_a_session_terminated_while_waiting_for_the_lock_commits_once(pg_url: str) -> None:
    Journal.create(pg_url).close()
    holder = psycopg.connect(pg_url)  # a transaction holding the journal's write lock
    holder.execute("LOCK TABLE charter_events IN EXCLUSIVE MODE")
    result: list[object] = []
    with Journal.open(pg_url) as journal:

        def write() -> None:
            try:
                result.append(journal.append([Ping(writer="w", batch=0, n=0)]))
            except Exception as e:
                result.append(e)

        thread = threading.Thread(target=write)
        thread.start()
        deadline = time.monotonic() + 10
        waiting: list[tuple[object, ...]] = []
        with _admin(pg_url) as admin:
            while not waiting and time.monotonic() < deadline:
                waiting = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                ).fetchall()
                time.sleep(0.02)
            assert waiting, "the append never waited for the lock"
            admin.execute("SELECT pg_terminate_backend(%s)", (waiting[0][0],))
        holder.rollback()
        holder.close()
        thread.join(20)
        assert len(result) == 1
        assert not isinstance(result[0], BaseException), result[0]
        assert [e.position for e in journal.entries()] == [1]  # once, not twice


def test_sqlite_file_replaced_by_garbage_is_a_contract_error(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    url = f"sqlite:///{path}"
    Journal.create(url).close()
    with Journal.open(url) as journal:
        journal.append([Ping(writer="w", batch=0, n=0)])
        assert journal.head() is not None  # positive control: reads work
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        path.write_bytes(b"not a database at all " * 400)  # SQLITE_NOTADB on every read
        with pytest.raises(UnavailableError):
            journal.head()
        with pytest.raises(UnavailableError):
            list(journal.entries())
    with pytest.raises(StateError, match="not a Charter journal"):
        Journal.open(url)


def test_a_closed_journal_is_a_state_error_on_both_backends(journal_url: str) -> None:
    Journal.create(journal_url).close()
    journal = Journal.open(journal_url)
    journal.append([Ping(writer="w", batch=0, n=0)])  # positive control
    journal.close()
    # The library's ConnectionPoolClosedError (SQLite) or a pool error (PostgreSQL)
    # would leak here otherwise.
    with pytest.raises(StateError, match="closed"):
        journal.append([Ping(writer="w", batch=1, n=0)])
    with pytest.raises(StateError, match="closed"):
        journal.stream_version("counter:x")
    with pytest.raises(StateError, match="closed"):
        journal.tracked_position("follower")
