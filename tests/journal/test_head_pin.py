"""The head pin (``Journal.append(expect_head=…, not_before_ms=…)``), on both recorders
and through the group-commit spool: a batch pinned to the journal's head as its decision
read it commits only if nothing at all committed since, and never stamped before its
not-before time; a lost pin writes nothing (docs/decisions-and-views.md, the fan-out
that takes a recent expiry as final). Through the spool: tests/journal/test_group_commit.py.
Every case ends with the auditor's fold."""

from __future__ import annotations

import os

import pytest

from charter.audit.journal import audit_journal
from charter.core import now_ms
from charter.ledger import AppendConflictError, HeadPinLostError, Journal
from charter.ledger._spool import Request
from tests.journal._support import Counter, Ping


def _head(journal: Journal) -> int:
    head = journal.head()
    return 0 if head is None else head[0]


def _audited(url: str) -> None:
    with Journal.open(url, read_only=True) as journal:
        report = audit_journal(journal)
        assert report.ok, report


def test_a_head_pin_loses_when_anything_commits_between_read_and_append(
    journal_url: str,
) -> None:
    Journal.create(journal_url).close()
    with Journal.open(journal_url) as mine, Journal.open(journal_url) as other:
        mine.append([Ping(writer="a", batch=0, n=0)])
        read = _head(mine)  # what the decision read up to
        # Another writer commits something unrelated (no stream the batch names).
        other.append([Ping(writer="b", batch=0, n=0)])
        with pytest.raises(HeadPinLostError) as lost:
            mine.append([Counter(name="c", value=1)], expect_head=read)
        assert isinstance(lost.value, AppendConflictError)  # the handlers retry it
        assert _head(mine) == read + 1  # nothing of the pinned batch was written
        assert not [e for e in mine.entries() if isinstance(e.event, Counter)]
        # Decided again on the journal as it is now: the pin holds, right after it.
        done = mine.append([Counter(name="c", value=1)], expect_head=read + 1)
        assert [c.position for c in done] == [read + 2]
        # And a pin that holds commits even with streams it does not pin moving before.
        assert mine.append([Ping(writer="a", batch=1, n=0)], expect_head=read + 2)
    _audited(journal_url)


def test_a_head_pin_refuses_a_commit_stamped_before_its_not_before_time(
    journal_url: str,
) -> None:
    Journal.create(journal_url).close()
    with Journal.open(journal_url) as journal:
        journal.append([Ping(writer="a", batch=0, n=0)])
        head = _head(journal)
        with pytest.raises(HeadPinLostError):
            journal.append(
                [Ping(writer="a", batch=1, n=0)], expect_head=head, not_before_ms=now_ms() + 60_000
            )
        assert _head(journal) == head
        with pytest.raises(HeadPinLostError):  # not before, without the head
            journal.append([Ping(writer="a", batch=1, n=0)], not_before_ms=now_ms() + 60_000)
        done = journal.append(
            [Ping(writer="a", batch=1, n=0)], expect_head=head, not_before_ms=now_ms() - 1
        )
        assert [c.position for c in done] == [head + 1]
    _audited(journal_url)


def test_the_spool_carries_a_batch_s_head_pin() -> None:
    request = Request(os.urandom(16), (), (), 5, 41, 1_700_000_000_000)
    assert Request.decode(request.encode()) == request
    bare = Request(os.urandom(16), (), (), None)
    assert Request.decode(bare.encode()) == bare
    assert (bare.expect_head, bare.not_before_ms) == (None, None)
