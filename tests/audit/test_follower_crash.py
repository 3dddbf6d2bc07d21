"""The Merkle follower killed with SIGKILL at arbitrary moments, and two followers
racing, while a writer appends: the tree's rows and its tracking position commit
together, so the tree ends as the RFC 6962 tree of exactly the journal's entries, each
leaf once (checked against the naive implementation)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from charter.audit.tree import MerkleLog
from charter.core.framing import entry_frame
from charter.ledger import Journal
from tests.audit import rfc6962
from tests.audit._support import fill, make_journal

ROOT = Path(__file__).resolve().parents[2]


def _start(url: str, chunk: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.audit._follow_proc", url, str(chunk)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _naive_root(journal: Journal) -> tuple[int, bytes]:
    leaves = [
        rfc6962.leaf(
            entry_frame(r.prev_hash, r.position, r.originator, r.version, r.topic.encode(), r.state)
        )
        for r in journal.rows()
    ]
    return len(leaves), rfc6962.Naive(leaves).mth(0, len(leaves))


def test_killed_and_racing_followers_leave_exactly_the_tree_of_the_entries(
    journal_url: str,
) -> None:
    rng = random.Random(13)
    journal, _ = make_journal(journal_url)
    with journal:
        fill(journal, 40)
        racers = [_start(journal_url, 7), _start(journal_url, 3)]
        try:
            for round_ in range(6):
                fill(journal, 15, tag=f"r{round_}")
                time.sleep(rng.uniform(0.0, 0.15))
                victim = racers.pop(rng.randrange(len(racers)))
                victim.send_signal(signal.SIGKILL)
                victim.wait(timeout=30)
                racers.append(_start(journal_url, rng.choice((1, 5, 50))))
        finally:
            for proc in racers:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
        log = MerkleLog(journal)
        size = log.catch_up()
        assert (size, log.root()[1]) == _naive_root(journal)
        assert log.tracked() == journal.head()[0]
        for leaf in range(size):  # every leaf once, in position order
            assert log.position_of_leaf(leaf) is not None
        assert log.position_of_leaf(size) is None
