"""The SQLite writers' turn (a flock queue beside the journal, holding the head hint
they share): a writer stalled holding it makes the others fail within the lock timeout
with WriterStalledError; a hint that is stale, or names no entry at all, never breaks
the chain."""

from __future__ import annotations

import fcntl
import os
import struct
import time
from pathlib import Path

import pytest

from charter.audit.journal import audit_journal
from charter.ledger import Journal, WriterStalledError
from tests.journal._support import Ping


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
