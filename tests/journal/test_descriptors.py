"""A journal closed gives back every file descriptor it opened (both backends): the
writers' turn file stayed open once per journal a process had ever written to, and a
long test run ran out of descriptors (``select()`` on a descriptor past 1023, then
"Too many open files")."""

from __future__ import annotations

import os
import resource
import select
from pathlib import Path

import pytest

from charter.ledger import Journal
from charter.ledger._spool import Spool
from tests.journal._support import Ping


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_closed_journal_holds_no_descriptor(journal_url: str) -> None:
    Journal.create(journal_url).close()
    with Journal.open(journal_url) as warm:  # the driver's own first-use descriptors
        warm.append([Ping(writer="w", batch=0, n=0)])
    before = _open_descriptors()
    for n in range(1, 6):
        with Journal.open(journal_url) as journal:
            journal.append([Ping(writer="w", batch=n, n=0)])  # takes the writers' turn
            assert len(list(journal.entries())) >= 2
    assert _open_descriptors() - before == set()


def test_a_batch_waits_in_the_spool_past_descriptor_1023(tmp_path: Path) -> None:
    """A process holding many descriptors (a cell with a thousand sandboxes) still waits
    for its spooled batch's answer: the wait polls its pipe, and select() refused any
    descriptor past 1023 ("filedescriptor out of range in select()", which killed a
    cell's claim renewal). Control: select() on the same descriptor is refused."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    journal = tmp_path / "j.db"
    journal.touch()
    filler = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    spool = Spool(journal)
    try:
        ticket = spool.offer((), (), None)
        assert spool._out > 1023  # the answer pipe is past select()'s limit
        with pytest.raises(ValueError, match="out of range"):
            select.select([spool._out], [], [], 0)
        assert spool.wait(ticket, 0.01) is None  # nothing answered it: no error either
        spool.done()
    finally:
        spool.close()
        for fd in filler:
            os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
