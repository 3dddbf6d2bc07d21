"""A follower's step that records its position with no new events (the library's
standard ``insert_events([], tracking=…)``), on both backends (issue 21 point 6)."""

from __future__ import annotations

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
