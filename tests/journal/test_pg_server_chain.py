"""PostgreSQL batches chained by the database (``_SERVER_CHAINED``): the hashes it
computes are the ones Python computes (the auditor recomputes every one), across the
genesis, multi-event batches and any bytes in a state; and its commit time is never
earlier than the head's, even when the head's time is ahead of the writer's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from charter.audit.journal import audit_journal
from charter.core.framing import entry_hash
from charter.ledger import Journal, _rows
from tests.journal._support import Ping

pytestmark = pytest.mark.postgres


def test_the_database_chains_as_python_does(pg_url: str) -> None:
    with Journal.create(pg_url) as journal:
        first = journal.append([Ping(writer="w", batch=0, n=0)])  # onto the genesis
        batch = journal.append(
            [Ping(writer="w", batch=1, n=i, pad="\u00e9\u2603\x00'\\" * i) for i in range(50)]
        )
        entries = list(journal.entries())
        assert [e.position for e in entries] == list(range(1, 52))
        assert [c.hash for c in (*first, *batch)] == [e.hash for e in entries]
        for row in journal.batches():
            for pos, oid, ver, topic, state, prev, chain in row:
                raw = journal.originator_bytes(oid)
                assert bytes(chain) == entry_hash(
                    bytes(prev), pos, raw, ver, topic.encode(), bytes(state)
                )
        report = audit_journal(journal)
        assert report.ok, report


def test_a_head_ahead_of_the_clock_is_the_floor_of_the_next_commit_time(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead = datetime.now(UTC) + timedelta(hours=1)

    class Clock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return ahead

    with Journal.create(pg_url) as journal:
        # A batch with a deadline is stamped in Python: here, an hour ahead.
        monkeypatch.setattr(_rows, "datetime", Clock)
        far = int((ahead + timedelta(days=1)).timestamp() * 1000)
        (early,) = journal.append([Ping(writer="w", batch=0, n=0)], deadline_ms=far)
        monkeypatch.undo()
        # A plain batch is stamped by the database's statement: not before that head.
        (late,) = journal.append([Ping(writer="w", batch=1, n=0)])
        assert early.recorded_at == ahead
        assert late.recorded_at == early.recorded_at
        report = audit_journal(journal)
        assert report.ok, report
