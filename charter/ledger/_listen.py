"""Commit wake-ups: a PostgreSQL journal's ``LISTEN``, so a follower learns of new
entries as they commit instead of only by polling.

Every committing transaction of the chained PostgreSQL recorder sends one ``NOTIFY`` on
the events table's channel (``charter_events``), inside the transaction: PostgreSQL
delivers it only after the commit, once per transaction, so a group of batches
committed together (group commit, decision 0008) is one notification. The
notification carries nothing: it only says "read from your tracked position". A
listener whose connection breaks reconnects and wakes its follower once it listens
again, so anything committed while it was away is caught up from the follower's own
position, never from the notifications (which PostgreSQL does not keep for a
session that is gone).

SQLite has no such channel: its followers keep polling (:meth:`Journal.listen`
answers None there).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["CHANNEL", "CommitListener"]

CHANNEL = "charter_events"  # the chained recorder's events table, as the library names it
_RECONNECT_S = 0.5  # a broken listener tries again this often
_TICK_S = 0.5  # how often the listening thread looks whether it was stopped


class CommitListener:
    """One thread with its own connection that ``LISTEN``s on the journal's channel and
    calls ``on_commit()`` after every notification (and after every (re)connection:
    the catch-up). ``on_commit`` must not block: it wakes a follower."""

    def __init__(self, conninfo: Mapping[str, Any], on_commit: Callable[[], None]) -> None:
        self._conninfo = dict(conninfo)
        self._on_commit = on_commit
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self.listening = threading.Event()  # set while a LISTEN is in force
        self.connections = 0  # how many times it (re)connected: for tests and status
        self.notifications = 0  # how many notifications it received
        self._thread = threading.Thread(target=self._run, name="journal-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(**self._conninfo, autocommit=True, connect_timeout=5) as conn:
                    self._conn = conn
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    self.connections += 1
                    self.listening.set()
                    self._on_commit()  # caught up from the follower's position
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=_TICK_S):
                            self.notifications += 1
                            self._on_commit()
            except (psycopg.Error, OSError):
                pass  # the server went away or the session was ended: listen again
            finally:
                self._conn = None
                self.listening.clear()
            self._stop.wait(_RECONNECT_S)

    def backend_pid(self) -> int | None:
        """The listening session's backend pid (a test ends it to show the catch-up)."""
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    def close(self) -> None:
        """Stop listening (within :data:`_TICK_S`)."""
        self._stop.set()
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout=5)
