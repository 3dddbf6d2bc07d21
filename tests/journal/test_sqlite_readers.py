"""The SQLite store's reused read connections: a reader kept between reads must see
every later commit (made by any process), hold no read transaction while idle (an
abandoned read included), be closed by ``close`` (leaving no side files), serve any
thread, and never be used by a forked child."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from charter.ledger import Journal
from tests.journal._support import Ping

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """How many sqlite3 connections this process has opened since the fixture began."""
    opened: list[int] = []
    real = sqlite3.connect

    def counting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(os.getpid())
        return real(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counting)
    return lambda: opened.count(os.getpid())


def _append_elsewhere(url: str, writer: str) -> None:
    """One commit of one ping by another process."""
    subprocess.run(
        [sys.executable, "-m", "tests.journal._support", url, writer, "1", "1"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )


def _checkpoint_blocked(path: Path) -> bool:
    """Whether a reader holds a snapshot: a TRUNCATE checkpoint then cannot finish."""
    conn = sqlite3.connect(path, timeout=0)
    try:
        busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    return bool(busy)


def test_a_reused_reader_sees_commits_of_another_process(
    sqlite_url: str, connects: Callable[[], int]
) -> None:
    Journal.create(sqlite_url).close()
    with Journal.open(sqlite_url) as journal:
        committed = journal.append([Ping(writer="here", batch=0, n=0)])
        assert journal.head() == (committed[0].position, committed[0].hash)
        before = connects()
        _append_elsewhere(sqlite_url, "there")
        head = journal.head()
        assert head is not None
        assert head[0] == committed[0].position + 1  # the other process's commit
        assert [e.event.writer for e in journal.entries()] == ["here", "there"]  # type: ignore[attr-defined]
        assert connects() == before  # positive control: the same reader, reused


def test_an_abandoned_read_leaves_no_snapshot_behind(sqlite_url: str, tmp_path: Path) -> None:
    Journal.create(sqlite_url).close()
    path = tmp_path / "journal.db"
    with Journal.open(sqlite_url) as journal:
        journal.append(Ping(writer="w", batch=0, n=i) for i in range(10_001))  # two batches
        reading = journal.payloads()
        assert len(next(reading)) == 10_000
        # Positive control: a read stopped mid-way holds its snapshot while it is live.
        assert _checkpoint_blocked(path)
        # ... and another read meanwhile takes another connection, which sees new commits.
        _append_elsewhere(sqlite_url, "there")
        head = journal.head()
        assert head is not None
        assert head[0] == 10_002
        del reading  # abandoned: its cursor is closed and its snapshot let go
        assert not _checkpoint_blocked(path)
        assert [len(b) for b in journal.payloads(start=10_001)] == [2]
        assert not _checkpoint_blocked(path)  # an idle reader holds nothing


def _side_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(("-wal", "-shm")))


def test_close_closes_the_readers_and_leaves_no_side_files(
    sqlite_url: str, tmp_path: Path, connects: Callable[[], int]
) -> None:
    Journal.create(sqlite_url).close()
    with Journal.open(sqlite_url) as writer:
        writer.append([Ping(writer="w", batch=0, n=0)])
    assert _side_files(tmp_path) == []
    journal = Journal.open(sqlite_url, read_only=True)
    before = connects()
    for _ in range(5):
        assert journal.head() is not None
        assert len(list(journal.entries())) == 1
    assert connects() == before + 1  # one reader, reused
    assert _side_files(tmp_path) == ["journal.db-shm", "journal.db-wal"]  # control: open
    journal.close()
    assert _side_files(tmp_path) == []
    # A read after close still works, on a connection of its own that it closes again.
    assert journal.head() is not None
    assert _side_files(tmp_path) == []


def test_a_reader_serves_whichever_thread_reads_next(
    sqlite_url: str, connects: Callable[[], int]
) -> None:
    Journal.create(sqlite_url).close()
    with Journal.open(sqlite_url) as journal:
        journal.append([Ping(writer="w", batch=0, n=0)])
        heads: list[object] = []
        thread = threading.Thread(target=lambda: heads.append(journal.head()))
        thread.start()
        thread.join()
        before = connects()
        assert journal.head() == heads[0]  # the thread's reader, used by this one
        assert connects() == before


def test_a_forked_child_opens_its_own_reader(sqlite_url: str, connects: Callable[[], int]) -> None:
    Journal.create(sqlite_url).close()
    with Journal.open(sqlite_url) as journal:
        committed = journal.append([Ping(writer="w", batch=0, n=0)])
        assert journal.head() is not None  # the parent's reader is idle, kept
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it read and how many connections it opened
            try:
                head = journal.head()
                journal._store.close()  # must not close the parent's reader
                ok = head == (committed[0].position, committed[0].hash) and connects() == 1
                os.write(write, b"ok" if ok else f"bad {head} {connects()}".encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            answer = pipe.read()
        os.waitpid(pid, 0)
        assert answer == b"ok"
        before = connects()
        assert journal.head() == (committed[0].position, committed[0].hash)
        assert connects() == before  # the parent's reader survived the child
