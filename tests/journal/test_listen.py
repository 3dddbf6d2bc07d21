"""Commit wake-ups (charter/ledger/_listen.py): on PostgreSQL a listener is woken by
another writer's commit, once per committed transaction (a group of batches committed
together is one notification), only after the commit; a listener whose session is
ended reconnects and wakes once more, so its follower catches up from its own
position. SQLite has no channel: ``listen`` answers None and its followers poll."""

from __future__ import annotations

import threading
import time

import psycopg

from charter.ledger import Journal
from tests.conftest import _pg_admin
from tests.journal._support import Ping


class _Woken:
    def __init__(self) -> None:
        self.count = 0
        self.cond = threading.Condition()

    def __call__(self) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def wait_past(self, n: int, within: float = 5.0) -> int:
        with self.cond:
            self.cond.wait_for(lambda: self.count > n, timeout=within)
            return self.count


def test_sqlite_has_no_listener(sqlite_url: str) -> None:
    with Journal.create(sqlite_url) as journal:
        assert journal.listen(lambda: None) is None


def test_another_writers_commit_wakes_the_listener_after_it_commits(pg_url: str) -> None:
    with Journal.create(pg_url) as journal:
        woken = _Woken()
        listener = journal.listen(woken)
        assert listener is not None
        try:
            assert listener.listening.wait(5)
            base = woken.wait_past(0)  # the wake-up of its first connection: a catch-up
            with Journal.open(pg_url) as other:
                other.append([Ping(writer="other", batch=0, n=0)])
            assert woken.wait_past(base) == base + 1
            assert listener.notifications == 1
            # Uncommitted, nothing is delivered: a NOTIFY in a transaction that rolls
            # back never reaches the listener (positive control: the commit above did).
            with psycopg.connect(pg_url) as conn:
                conn.execute('NOTIFY "charter_events"')
                conn.rollback()
            time.sleep(0.5)
            assert listener.notifications == 1
        finally:
            listener.close()


def test_a_listener_whose_session_ends_reconnects_and_catches_up(pg_url: str) -> None:
    with Journal.create(pg_url) as journal:
        woken = _Woken()
        listener = journal.listen(woken)
        assert listener is not None
        try:
            assert listener.listening.wait(5)
            base = woken.wait_past(0)
            pid = listener.backend_pid()
            assert pid is not None
            with _pg_admin() as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # While it is away a commit lands; it is not notified of it, but wakes
            # once it listens again (its follower reads from its own position).
            journal.append([Ping(writer="away", batch=0, n=0)])
            deadline = time.monotonic() + 10
            while listener.connections < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert listener.connections == 2
            assert woken.wait_past(base) > base
            assert listener.backend_pid() != pid
        finally:
            listener.close()
