"""A projection process killed with SIGKILL and restarted processes every event
exactly once: the per-type counters (incremented in the same transaction as the rows
and the tracking position) equal the journal's own count, and the rows equal a
rebuild from zero."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from charter.ledger import Journal
from charter.projections import Projector
from tests.projections.history import History

NAME = "killed"
_FOLLOWER = """
import sys
from charter.ledger.journal import Journal
from charter.projections import Projector
with Journal.open(sys.argv[1]) as journal:
    projector = Projector(journal, sys.argv[2])
    print("ready", flush=True)
    projector.follow(poll_s=0.001, chunk=int(sys.argv[3]))
"""


def _wait_for(condition: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.0005)
    return False


def test_sigkill_restart_processes_every_event_exactly_once(journal_url: str) -> None:
    Journal.create(journal_url).close()
    rng = random.Random(5)
    history = History(11).batches(10_000)
    interrupted = 0
    with Journal.open(journal_url) as journal:
        for _ in range(3):
            journal.append(next(history))
        for _round in range(12):
            # A backlog of several hundred entries, read in small chunks, so the
            # follower is mid-way through it (most often mid-transaction) when killed.
            for _ in range(rng.randint(150, 250)):
                journal.append(next(history))
            head = journal.head()
            assert head is not None
            before = journal.tracked_position(f"charter.projections.{NAME}")
            # The kill lands once the follower has passed a random point in the first
            # third of the backlog: at least two thirds of it (hundreds of entries, tens
            # of commits) are still ahead of it then, whatever the machine's speed.
            target = before + rng.randint(1, (head[0] - before) // 3)
            child = subprocess.Popen(
                [sys.executable, "-c", _FOLLOWER, journal_url, NAME, str(rng.randint(3, 20))],
                stdout=subprocess.PIPE,
                env=os.environ.copy(),
            )
            try:
                assert child.stdout is not None
                assert child.stdout.readline().strip() == b"ready"
                assert _wait_for(
                    lambda t=target: journal.tracked_position(f"charter.projections.{NAME}") >= t,
                    timeout=30,
                )
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=30)
            assert child.returncode == -signal.SIGKILL
            if journal.tracked_position(f"charter.projections.{NAME}") < head[0]:
                interrupted += 1
        # Positive control: the kills landed before the follower had caught up.
        assert interrupted >= 10

        rows = sum(1 for _ in journal.rows())
        with Projector(journal, NAME) as survivor, Projector(journal, "fresh") as fresh:
            survivor.catch_up()
            fresh.rebuild()
            assert sum(survivor.counts().values()) == rows
            assert survivor.counts() == fresh.counts()
            head = journal.head()
            assert head is not None
            for p in range(1, head[0] + 1, max(1, head[0] // 40)):
                assert survivor.budgets(as_of=p) == fresh.budgets(as_of=p), p
                assert survivor.slots(as_of=p) == fresh.slots(as_of=p), p
                assert survivor.tree(as_of=p) == fresh.tree(as_of=p), p
            assert survivor.budgets(as_of=head[0]) == fresh.budgets(as_of=head[0])
