"""The SQLite writers' turn (a flock queue beside the journal, holding the head hint
they share): a writer stalled holding it makes the others fail within the lock timeout
with WriterStalledError; a hint that is stale, or names no entry at all, never breaks
the chain."""

from __future__ import annotations

import fcntl
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from charter.audit.journal import audit_journal
from charter.ledger import Journal, WriterStalledError, _turn
from charter.ledger._turn import WriterTurn
from tests.journal._support import Gathering, Ping


def test_a_writer_stalled_holding_the_turn_is_writer_stalled(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    Journal.create(url).close()
    with Journal.open(url, env={"SQLITE_LOCK_TIMEOUT": "1"}) as journal:
        journal.append([Ping(writer="w", batch=0, n=0)])  # makes the turn file
        fd = os.open(tmp_path / "j.db-writer", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process's stalled writer, as it were
        try:
            started = time.monotonic()
            with pytest.raises(WriterStalledError):
                journal.append([Ping(writer="w", batch=1, n=0)])
            assert 0.9 <= time.monotonic() - started < 10
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        journal.append([Ping(writer="w", batch=1, n=0)])  # positive control
        assert len(list(journal.entries())) == 2


@pytest.mark.parametrize("hint", ["stale", "bogus"])
def test_a_wrong_head_hint_never_breaks_the_chain(tmp_path: Path, hint: str) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    Journal.create(url).close()
    turn = tmp_path / "j.db-writer"
    with Journal.open(url) as journal:
        first = journal.append([Ping(writer="w", batch=0, n=0)])
        saved = turn.read_bytes()
        journal.append([Ping(writer="w", batch=1, n=0)])
        if hint == "stale":  # left by a writer killed between its commit and the hint
            turn.write_bytes(saved)
            assert struct.unpack(">q", saved[:8])[0] == first[0].position
        else:  # names an entry that does not exist, far ahead of the head
            turn.write_bytes(struct.pack(">q32s32s", 99, os.urandom(32), saved[40:72]))
        journal.append([Ping(writer="w", batch=2, n=0)])
        report = audit_journal(journal)
        assert report.ok, report
        assert [e.position for e in journal.entries()] == [1, 2, 3]


def test_threads_taking_a_new_turn_at_once_share_one_open_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads of one process that take a turn nobody has opened yet, all at once, open
    its file once: ``flock`` belongs to the open file, and a lock taken through a second
    one of this process but let go through the first stayed held for good (every later
    writer of the journal waited its whole lock timeout: WriterStalledError)."""
    threads = 4
    turn = WriterTurn(tmp_path / "j.db")
    inside = Gathering(threads, WriterTurn._file.__code__)
    opened: list[Any] = []
    real_open = os.open

    def open_once_all_look(path: Any, *args: Any) -> int:
        opened.append(path)
        inside.wait()  # every thread has looked whether the file is open
        return real_open(path, *args)

    class _Os:
        open = staticmethod(open_once_all_look)

        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

    monkeypatch.setattr(_turn, "os", _Os())

    def take_and_release() -> bool:
        inside.join()
        if not turn.try_take():
            return False
        turn.release()
        return True

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(take_and_release) for _ in range(threads)]
        took = [f.result(timeout=60) for f in futures]
    monkeypatch.undo()
    assert opened == [turn.path]  # one open file for the process (before: one per thread)
    assert any(took)
    fd = os.open(turn.path, os.O_RDWR)  # another process: the turn is free again
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    turn.close()
