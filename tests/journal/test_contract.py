"""The journal contract: run against real SQLite and real PostgreSQL alike."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError

from charter.audit import audit_chain, verify_chain
from charter.ledger import (
    AlreadyTrackedError,
    AppendConflictError,
    AppendFailedError,
    ChainedPostgresProcessRecorder,
    ChainedSQLiteProcessRecorder,
    Journal,
)

from ._support import Counter, Ping

SUPPORT = Path(__file__).with_name("_support.py")
ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{SUPPORT.parent}"}


def _pings(journal: Journal) -> list[Ping]:
    return [e.event for e in journal.entries(types=("TestPing",))]  # type: ignore[misc]


def test_append_returns_committed_positions_and_hashes(journal_url: str) -> None:
    with Journal.create(journal_url) as j:
        first = j.append([Ping(writer="a", batch=0, n=i) for i in range(3)])
        second = j.append([Ping(writer="a", batch=1, n=0)])
        assert [c.position for c in first] == [1, 2, 3]
        assert second[0].position == 4
        assert j.head() == (4, second[0].hash)
        entries = list(j.entries())
        assert [e.hash for e in entries] == [c.hash for c in (*first, *second)]
        assert entries[1].prev_hash == first[0].hash
        assert verify_chain(j).checked == 4


def test_thousand_events_are_one_transaction(journal_url: str) -> None:
    """A failure at event 500 (a stale stream version) leaves none of the 1000."""
    with Journal.create(journal_url) as j:
        j.append([Counter(name="c", value=0)])
        batch: list[Any] = [Ping(writer="a", batch=0, n=i) for i in range(1000)]
        batch[500] = Counter(name="c", value=1)
        with pytest.raises(AppendConflictError):
            j.append(batch, expect={"counter:c": 0})  # it is at 1 already
        assert j.head() is not None
        assert j.head()[0] == 1  # type: ignore[index]
        assert _pings(j) == []
        assert verify_chain(j).checked == 1


class _FailMidBatchSQLite(ChainedSQLiteProcessRecorder):
    """The real recorder, made to fail after inserting half a batch in its transaction."""

    def _insert_events(self, c: Any, stored_events: Any, **kwargs: Any) -> Any:
        half = len(stored_events) // 2
        super()._insert_events(c, stored_events[:half], **kwargs)
        raise OperationalError("injected failure mid-batch")


class _FailMidBatchPostgres(ChainedPostgresProcessRecorder):
    def _insert_stored_events(self, curs: Any, stored_events: Any, **kwargs: Any) -> None:
        half = len(stored_events) // 2
        super()._insert_stored_events(curs, stored_events[:half], **kwargs)
        raise OperationalError("injected failure mid-batch")


def test_failure_injected_inside_the_transaction_leaves_nothing(journal_url: str) -> None:
    """The real recorder fails after inserting 500 of 1000 rows: none of them remain."""
    Journal.create(journal_url).close()
    faulty = "_FailMidBatchSQLite" if journal_url.startswith("sqlite") else "_FailMidBatchPostgres"
    env = {"APPLICATION_RECORDER_TOPIC": f"tests.journal.test_contract:{faulty}"}
    with Journal.open(journal_url, env=env) as j:
        with pytest.raises(AppendFailedError):
            j.append([Ping(writer="a", batch=0, n=i) for i in range(1000)])
        assert j.head() is None
    with Journal.open(journal_url) as j:  # the real recorder appends after it
        assert j.append([Ping(writer="a", batch=1, n=0)])[0].position >= 1
        assert verify_chain(j).checked == 1


def test_stale_decision_conflicts_and_writes_nothing(journal_url: str) -> None:
    with Journal.create(journal_url) as j:
        j.append([Counter(name="c", value=1)])
        assert j.stream_version("counter:c") == 1
        j.append([Counter(name="c", value=2)], expect={"counter:c": 1})
        with pytest.raises(AppendConflictError):
            j.append([Counter(name="c", value=99)], expect={"counter:c": 1})
        # Unpinned appends are versioned automatically.
        j.append([Counter(name="c", value=3)])
        values = [e.event.value for e in j.entries(types=("TestCounter",))]  # type: ignore[attr-defined]
        assert values == [1, 2, 3]


def test_a_chains_stream_versions_read_at_once_are_each_streams_last(journal_url: str) -> None:
    # One read for several streams (a decision's chain), each its last version; a
    # stream with no entries is 0, named twice it is answered once.
    rng = random.Random(7)
    names = ["a", "b", "c", "d"]
    with Journal.create(journal_url) as j:
        for value in range(60):
            j.append([Counter(name=rng.choice(names[:3]), value=value)])
        streams = [f"counter:{n}" for n in [*names, "a"]]
        one_read = j.stream_versions(streams)
        assert one_read == {s: j.stream_version(s) for s in streams}
        assert one_read["counter:d"] == 0
        assert sorted(one_read.values())[1:] == sorted(
            Tally(e.event.stream() for e in j.entries(types=("TestCounter",))).values()
        )
        assert j.stream_versions([]) == {}


def test_handles_with_stale_head_hints_chain_onto_the_real_head(journal_url: str) -> None:
    """Each handle chains its next commit onto the head it last wrote; after another
    handle has appended, that hint is stale and the commit must land on the real head."""
    Journal.create(journal_url).close()
    with Journal.open(journal_url) as a, Journal.open(journal_url) as b:
        written: list[int] = []
        for i in range(24):
            writer = b if i % 3 == 0 else a
            committed = writer.append([Ping(writer="w", batch=i, n=n) for n in range(i % 4 + 1)])
            written += [c.position for c in committed]
        assert written == list(range(1, len(written) + 1))
        report = audit_chain(a)
        assert report.ok, report.reason
        assert report.checked == len(written)
        assert [(p.batch, p.n) for p in _pings(b)] == [
            (i, n) for i in range(24) for n in range(i % 4 + 1)
        ]


def test_a_race_on_an_unpinned_stream_retries_and_a_pinned_one_conflicts(
    journal_url: str,
) -> None:
    """Another writer appends between this append reading its stream versions and
    inserting: when only an unpinned stream moved, the append re-versions and lands;
    when a pinned stream moved, it raises and writes nothing."""
    Journal.create(journal_url).close()
    with Journal.open(journal_url) as j, Journal.open(journal_url) as other:
        j.append([Counter(name="a", value=1), Counter(name="b", value=1)])
        build = j._envelopes
        racer: list[Counter] = []

        def racing(*args: Any, **kwargs: Any) -> Any:
            envelopes = build(*args, **kwargs)
            while racer:  # the other writer lands first, once
                other.append([racer.pop()])
            return envelopes

        j._envelopes = racing  # type: ignore[method-assign]
        racer.append(Counter(name="b", value=2))
        j.append([Counter(name="a", value=3), Counter(name="b", value=3)], expect={"counter:a": 1})
        assert (j.stream_version("counter:a"), j.stream_version("counter:b")) == (2, 3)

        racer.append(Counter(name="a", value=4))
        before = j.head()
        with pytest.raises(AppendConflictError):
            j.append([Counter(name="a", value=5)], expect={"counter:a": 2})
        assert j.stream_version("counter:a") == 3  # the racer's entry only
        assert before is not None
        assert j.head()[0] == before[0] + 1  # type: ignore[index]

        # A pinned stream the batch does not write to is checked too.
        racer.append(Counter(name="a", value=6))
        with pytest.raises(AppendConflictError):
            j.append([Counter(name="b", value=7)], expect={"counter:a": 3})
        assert j.stream_version("counter:b") == 3
        j.append([Counter(name="b", value=8)], expect={"counter:a": 4})  # control
        assert j.stream_version("counter:b") == 4


def test_update_and_delete_are_refused_by_the_database(journal_url: str) -> None:
    with Journal.create(journal_url) as j:
        j.append([Ping(writer="a", batch=0, n=0)])
    with _Raw(journal_url) as raw:
        for statement in raw.mutations():
            with pytest.raises(Exception, match="append-only"):
                raw.execute(statement)
    with Journal.open(journal_url) as j:
        assert verify_chain(j).checked == 1


def test_concurrent_writers_make_one_linear_chain(journal_url: str) -> None:
    """4 processes x 200 appends: one chain that verifies, each append exactly once."""
    Journal.create(journal_url).close()
    writers = [
        subprocess.Popen(
            [sys.executable, str(SUPPORT), journal_url, f"w{w}", "200", "1"],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for w in range(4)
    ]
    for p in writers:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    with Journal.open(journal_url) as j:
        report = audit_chain(j)
        assert report.ok, report.reason
        assert report.checked == 800
        seen = Tally((p.writer, p.batch) for p in _pings(j))
        assert set(seen.values()) == {1}
        assert len(seen) == 800


@pytest.mark.slow
def test_writer_killed_at_random_moments(journal_url: str) -> None:
    """SIGKILL a writer 20 times: the journal verifies, each append is all or nothing."""
    Journal.create(journal_url).close()
    rng = random.Random(20261129)
    batch_size = 50
    for trial in range(20):
        writer = subprocess.Popen(
            [sys.executable, str(SUPPORT), journal_url, f"t{trial}", "1000", str(batch_size)],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert writer.stdout is not None
        # Wait for a real event (some commits done), then kill at a random moment after.
        for _ in range(rng.randint(1, 8)):
            assert writer.stdout.readline(), "writer exited early"
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=30)
        assert writer.returncode == -signal.SIGKILL
    with Journal.open(journal_url) as j:
        report = audit_chain(j)
        assert report.ok, report.reason
        per_batch = Tally((p.writer, p.batch) for p in _pings(j))
        assert per_batch, "no append survived: the test could not tell anything"
        assert set(per_batch.values()) == {batch_size}
        # every trial committed at least the batches it announced
        assert {w for w, _ in per_batch} == {f"t{t}" for t in range(20)}


class _Raw:
    """Direct database access, as an attacker or an operator with a SQL shell has."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")
        self.table = "stored_events" if self.sqlite else "charter_events"
        self.pos = "rowid" if self.sqlite else "notification_id"

    def __enter__(self) -> _Raw:
        if self.sqlite:
            import sqlite3

            self.conn: Any = sqlite3.connect(self.url[len("sqlite:///") :], isolation_level=None)
        else:
            import psycopg

            from charter.ledger import resolve_location

            info = resolve_location(self.url).conninfo
            assert info is not None
            self.conn = psycopg.connect(**info, autocommit=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        if not self.sqlite:
            sql = sql.replace("?", "%s")
        cur = self.conn.execute(sql, params)
        try:
            return list(cur.fetchall())
        except Exception:
            return []

    def mutations(self) -> list[str]:
        t = self.table
        return [
            f"UPDATE {t} SET topic = 'x'",
            f"DELETE FROM {t}",
            f"UPDATE {t} SET state = state WHERE {self.pos} = 1",
        ]

    def drop_guards(self) -> None:
        """What an attacker with database access does first."""
        if self.sqlite:
            for name in ("no_update", "no_delete"):
                self.execute(f"DROP TRIGGER IF EXISTS stored_events_{name}")
        else:
            self.execute("DROP TRIGGER IF EXISTS charter_events_no_change ON charter_events")
            self.execute("DROP TRIGGER IF EXISTS charter_events_no_truncate ON charter_events")


def test_follower_position_commits_with_its_events_exactly_once(journal_url: str) -> None:
    """The process-recorder variant: tracking and new chained events in one transaction."""
    with Journal.create(journal_url) as j:
        j.append([Ping(writer="leader", batch=0, n=i) for i in range(3)])
        j.append([Ping(writer="follower", batch=0, n=0)], tracking=("follower", 2))
        assert j.tracked_position("follower") == 2
        with pytest.raises(AlreadyTrackedError):
            j.append([Ping(writer="follower", batch=0, n=1)], tracking=("follower", 2))
        # the refused append left no event behind, and the chain is intact
        assert [p.n for p in _pings(j) if p.writer == "follower"] == [0]
        assert verify_chain(j).checked == 4
        j.append([Ping(writer="follower", batch=1, n=0)], tracking=("follower", 3))
        assert j.tracked_position("follower") == 3


def test_replace_is_refused_by_the_database(sqlite_url: str) -> None:
    """REPLACE deletes the row it conflicts with without firing DELETE triggers: the
    journal refuses it too, on the events and on the write-once metadata."""
    with Journal.create(sqlite_url) as j:
        j.append([Ping(writer="a", batch=0, n=0)])
        j.append([Ping(writer="a", batch=1, n=0)])
    with _Raw(sqlite_url) as raw:
        first = raw.execute("SELECT rowid, * FROM stored_events WHERE rowid = 1")[0]
        forged = (first[0], first[1], first[2], first[3], b"{}", first[5], first[6])
        for verb in ("REPLACE", "INSERT OR REPLACE"):
            with pytest.raises(Exception, match="append-only"):
                raw.execute(
                    f"{verb} INTO stored_events (rowid, originator_id, originator_version, "
                    "topic, state, prev_hash, chain_hash) VALUES (?,?,?,?,?,?,?)",
                    forged,
                )
        with pytest.raises(Exception, match="write-once"):
            raw.execute("INSERT OR REPLACE INTO charter_meta VALUES ('format', 'forged')")
        # Control: a genuinely new row is not refused by these triggers (it fails the
        # chain instead, which verification reports).
        raw.execute(
            "INSERT INTO stored_events (rowid, originator_id, originator_version, topic, "
            "state, prev_hash, chain_hash) VALUES (?,?,?,?,?,?,?)",
            (99, "ab" * 16, 1, "Ping/v1", b"{}", b"\x01" * 32, b"\x02" * 32),
        )
        with Journal.open(sqlite_url) as j:
            assert next(iter(j.rows())).state != b"{}"  # the first entry is as written
        # Positive control: with that trigger dropped, the same REPLACE goes through.
        raw.execute("DROP TRIGGER stored_events_no_replace")
        raw.execute(
            "REPLACE INTO stored_events (rowid, originator_id, originator_version, topic, "
            "state, prev_hash, chain_hash) VALUES (?,?,?,?,?,?,?)",
            forged,
        )
    with Journal.open(sqlite_url) as j:
        assert next(iter(j.rows())).state == b"{}"
        assert audit_chain(j).first_bad_position == 1  # and verification catches it


@pytest.mark.postgres
def test_a_stalled_writer_makes_the_others_fail_clearly_within_the_lock_timeout(
    pg_url: str,
) -> None:
    """A writer stalled while holding the journal's table lock: another append gives up
    after the lock timeout (2 s here; 30 s by default) with a clear error and writes
    nothing, instead of waiting without limit (or retrying ten times over)."""
    Journal.create(pg_url).close()
    with _Raw(pg_url) as stalled:
        stalled.conn.autocommit = False
        stalled.execute("LOCK TABLE charter_events IN EXCLUSIVE MODE")  # and then nothing
        with Journal.open(pg_url, env={"POSTGRES_LOCK_TIMEOUT": "2"}) as j:
            start = time.monotonic()
            with pytest.raises(AppendFailedError, match="held the journal's write lock"):
                j.append([Ping(writer="a", batch=0, n=0)])
            waited = time.monotonic() - start
        stalled.conn.rollback()
    assert 1.5 < waited < 10
    with Journal.open(pg_url) as j:  # control: once the stall ends, appends go through
        assert j.head() is None
        j.append([Ping(writer="a", batch=0, n=0)])
        assert verify_chain(j).checked == 1
