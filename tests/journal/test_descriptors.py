"""A journal closed gives back every file descriptor it opened (both backends): the
writers' turn file stayed open once per journal a process had ever written to, and a
long test run ran out of descriptors (``select()`` on a descriptor past 1023, then
"Too many open files")."""

from __future__ import annotations

import os

from charter.ledger import Journal
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
