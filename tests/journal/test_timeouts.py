"""A writer stalled while holding the journal's write lock makes the others fail with
a clear named error (WriterStalledError) within the configured timeout, on PostgreSQL
(lock and statement timeouts, set through Settings) and on SQLite (busy timeout)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg
import pytest

from charter.app import Settings
from charter.core import BadInputError
from charter.ledger import AppendFailedError, Journal, WriterStalledError
from tests.journal._support import Ping


def _stalled_writer(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A session inside a transaction holding the journal's write lock, doing nothing."""
    holder = psycopg.connect(url)
    holder.execute("LOCK TABLE charter_events IN EXCLUSIVE MODE")
    return holder


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("settings", "which"),
    [
        (Settings(pg_lock_timeout_s=1, pg_statement_timeout_s=60), "lock timeout"),
        (Settings(pg_lock_timeout_s=30, pg_statement_timeout_s=1.0), "statement timeout"),
    ],
)
def test_a_stalled_writer_makes_others_fail_within_the_timeout(
    pg_url: str, settings: Settings, which: str
) -> None:
    Journal.create(pg_url).close()
    with Journal.open(pg_url, env=settings.journal_env()) as journal:
        journal.append([Ping(writer="w", batch=0, n=0)])
        holder = _stalled_writer(pg_url)
        try:
            started = time.monotonic()
            with pytest.raises(WriterStalledError, match=which) as stalled:
                journal.append([Ping(writer="w", batch=1, n=0)])
            waited = time.monotonic() - started
            assert isinstance(stalled.value, AppendFailedError)  # nothing written
            assert 0.9 <= waited < 10, waited  # the configured 1 s, not 30 s or forever
        finally:
            holder.rollback()
            holder.close()
        # Positive control: with the stalled writer gone the same append commits.
        committed = journal.append([Ping(writer="w", batch=1, n=0)])
        assert [e.position for e in journal.entries()] == [1, committed[0].position]


@pytest.mark.postgres
def test_the_default_timeouts_are_set_on_every_writer_session(pg_url: str) -> None:
    Journal.create(pg_url).close()
    with Journal.open(pg_url, env={"POSTGRES_POOL_SIZE": "1"}) as journal:
        journal.append([Ping(writer="w", batch=0, n=0)])
        datastore = journal.application.recorder.datastore  # type: ignore[attr-defined]
        with datastore.get_connection() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "1min"


def test_sqlite_stalled_writer_is_writer_stalled(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    Journal.create(url).close()
    holder = sqlite3.connect(tmp_path / "j.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with Journal.open(url, env={"SQLITE_LOCK_TIMEOUT": "1"}) as journal:
            started = time.monotonic()
            with pytest.raises(WriterStalledError):
                journal.append([Ping(writer="w", batch=0, n=0)])
            assert time.monotonic() - started < 10
            holder.execute("ROLLBACK")
            assert journal.append([Ping(writer="w", batch=1, n=0)])  # positive control
    finally:
        holder.close()


@pytest.mark.parametrize(
    ("name", "value"),
    [("CHARTER_PG_STATEMENT_TIMEOUT", "soon"), ("CHARTER_PG_LOCK_TIMEOUT", "0")],
)
def test_malformed_timeouts_are_bad_input(name: str, value: str) -> None:
    with pytest.raises(BadInputError, match="settings"):
        Settings.from_env({name: value})
    assert Settings.from_env({name: "5"}).journal_env()  # positive control
