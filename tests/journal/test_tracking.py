"""A follower's step that records its position with no new events (the library's
standard ``insert_events([], tracking=…)``), on both backends (issue 21 point 6)."""

from __future__ import annotations

from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError, Tracking

from charter.ledger import Journal

from ._support import Ping


def test_tracking_without_events_records_the_position_and_writes_nothing(
    journal_url: str,
) -> None:
    with Journal.create(journal_url) as j:
        j.append([Ping(writer="w", batch=0, n=0)])
        head = j.head()
        recorder = j.application.recorder
        recorder.insert_events([], tracking=Tracking("follower", 1))  # type: ignore[call-arg]
        assert j.tracked_position("follower") == 1
        assert j.head() == head  # no entry, so no link in the chain either
        # Exactly once: the same position again is refused by the database.
        with pytest.raises(IntegrityError):
            recorder.insert_events([], tracking=Tracking("follower", 1))  # type: ignore[call-arg]
        assert j.tracked_position("follower") == 1
        # Positive control: the next position records, and the journal appends as before.
        recorder.insert_events([], tracking=Tracking("follower", 2))  # type: ignore[call-arg]
        assert j.tracked_position("follower") == 2
        assert j.append([Ping(writer="w", batch=1, n=0)])[0].position == 2


@pytest.mark.postgres
@pytest.mark.parametrize("isolated", [False, True])
def test_a_position_alone_commits_in_a_postgres_group_with_other_batches(
    pg_url: str, isolated: bool
) -> None:
    """A leader whose own batch is a follower's position alone, committing batches that
    waited in the spool with it: in one pipelined flight, or one savepoint per batch."""
    from charter.ledger._app import Envelope, now, stream_uuid
    from charter.ledger._group import Batch

    with Journal.create(pg_url) as j:
        j.append([Ping(writer="w", batch=0, n=0)])
        app = j.application
        recorder: Any = app.recorder
        stored = [
            app.mapper.to_stored_event(
                Envelope(stream_uuid(None), 1, now(), Ping(writer="waiting", batch=1, n=n), "b1")
            )
            for n in range(2)
        ]
        batches = [Batch((), {"tracking": Tracking("follower", 1)}), Batch(tuple(stored), {})]
        with recorder.datastore.get_connection() as conn:
            own, waiting = recorder._insert_group(conn, batches, isolated=isolated)
        assert own.positions == ()
        assert waiting.positions == (2, 3)
        assert j.tracked_position("follower") == 1
        assert [e.position for e in j.batch_entries("b1")] == [2, 3]
        assert j.head() is not None
        assert j.head()[0] == 3
