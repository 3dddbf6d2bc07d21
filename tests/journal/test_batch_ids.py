"""Batch ids are unique under the write lock (issue 21 point 2), on SQLite and on
PostgreSQL: the batch index's primary key, written in the same transaction as the
entries, lets exactly one of several appends racing with one id commit, on every
path (alone, in one group commit, across groups); each caller gets the journaled
entries of that batch, or BatchCommittedError if its request was another one. A
lookup by id is an index read. A journal made before the index gets it, built from
its entries, at its first append."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psycopg
import pytest

from charter.audit.journal import audit_journal
from charter.core.errors import StateError
from charter.ledger import AppendFailedError, BatchCommittedError, Committed, Journal, _sqlite
from charter.ledger._rows import batch_runs
from tests.journal._support import Ping
from tests.journal.test_group_commit import _turn_held, _waiting

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def shared(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, str, str]:
    """A new journal of the backend: the place its writers' turn and spool are named
    after (as in test_group_commit), and its URL."""
    if backend == "sqlite":
        db = tmp_path / "j.db"
        Journal.create(f"sqlite:///{db}").close()
        return db, f"sqlite:///{db}", backend
    url = str(request.getfixturevalue("pg_url"))
    Journal.create(url).close()
    with Journal.open(url) as journal:
        place = journal._writer()[0].events.recorder._spool_place()  # type: ignore[attr-defined]
    return place, url, backend


# -- the database's side ---------------------------------------------------------------


@contextmanager
def _raw(url: str) -> Iterator[Any]:
    """A plain driver connection to the journal's database (autocommit off)."""
    if url.startswith("sqlite"):
        conn: Any = sqlite3.connect(urlparse(url).path, isolation_level="DEFERRED")
    else:
        u = urlparse(url)
        conn = psycopg.connect(
            host=u.hostname, port=u.port, user=u.username, dbname=u.path.lstrip("/")
        )
    with closing(conn):
        yield conn


def _refused(url: str, statement: str, params: tuple[Any, ...] = ()) -> bool:
    with _raw(url) as conn:
        try:
            conn.execute(statement, params)
            conn.commit()
        except (sqlite3.Error, psycopg.Error):
            conn.rollback()
            return True
        conn.rollback()
        return False


def _pings(url: str) -> list[tuple[str, int, int, int]]:
    with Journal.open(url, read_only=True) as journal:
        return [
            (e.event.writer, e.event.batch, e.event.n, e.position)
            for e in journal.entries()
            if isinstance(e.event, Ping)
        ]


def _journaled(url: str, batch: str) -> list[tuple[int, bytes]]:
    with Journal.open(url, read_only=True) as journal:
        return [(e.position, e.hash) for e in journal.batch_entries(batch)]


def _as_pairs(committed: tuple[Committed, ...]) -> list[tuple[int, bytes]]:
    return [(c.position, c.hash) for c in committed]


def test_every_append_is_indexed_and_the_database_refuses_a_second_row_for_an_id(
    journal_url: str,
) -> None:
    with Journal.create(journal_url) as journal:
        mine = journal.append([Ping(writer="w", batch=0, n=i) for i in range(3)], batch="req1")
        journal.append([Ping(writer="w", batch=1, n=0)])  # a fresh id, indexed too
    with _raw(journal_url) as conn:
        rows = conn.execute("SELECT batch, first_position, last_position FROM charter_batches")
        index = {r[0]: (r[1], r[2]) for r in rows.fetchall()}
    assert index["req1"] == (mine[0].position, mine[-1].position)
    assert len(index) == 2
    insert = "INSERT INTO charter_batches VALUES ({p}, {p}, {p})"
    p = "?" if journal_url.startswith("sqlite") else "%s"
    assert _refused(journal_url, insert.format(p=p), ("req1", 90, 90))
    assert _refused(journal_url, "UPDATE charter_batches SET last_position = 9")
    assert _refused(journal_url, "DELETE FROM charter_batches")
    if journal_url.startswith("sqlite"):
        assert _refused(
            journal_url, "INSERT OR REPLACE INTO charter_batches VALUES (?,?,?)", ("req1", 9, 9)
        )
    # Positive control: a new id is taken (then rolled back by _refused).
    assert not _refused(journal_url, insert.format(p=p), ("req2", 90, 90))


def test_a_retry_gets_its_committed_entries_and_another_request_is_refused(
    journal_url: str,
) -> None:
    with Journal.create(journal_url) as journal:
        first = journal.append([Ping(writer="w", batch=0, n=i) for i in range(2)], batch="req1")
        head = journal.head()
        again = journal.append([Ping(writer="w", batch=0, n=i) for i in range(2)], batch="req1")
        assert again == first  # the same request retried: the same entries, nothing new
        with pytest.raises(BatchCommittedError) as caught:
            journal.append([Ping(writer="other", batch=0, n=0)], batch="req1")
        assert caught.value.batch == "req1"
        assert caught.value.positions == (first[0].position, first[-1].position)
        assert journal.head() == head  # nothing written
        with pytest.raises(BatchCommittedError):
            journal.require_new_batch("req1")
        journal.require_new_batch("req2")  # positive control: a new id is new
    assert _journaled(journal_url, "req1") == _as_pairs(first)


# -- racing appends with one id ----------------------------------------------------------


def _batch(writer: str) -> list[Ping]:
    return [Ping(writer=writer, batch=0, n=i) for i in range(3)]


def _past_the_check_together(
    monkeypatch: pytest.MonkeyPatch, parties: int, barrier: Any
) -> list[int]:
    """Hold every append right after its own look for an earlier batch with its id
    (which finds none) until all ``parties`` have looked: then none can have seen the
    other's commit, and only the database's key stands between them and two commits.
    Returns how many looks found nothing (this process's)."""
    found_nothing: list[int] = []
    look = Journal._earlier

    def looked_together(self: Journal, batch_id: str, events: Any) -> Any:
        earlier = look(self, batch_id, events)
        if not earlier and len(found_nothing) < parties:
            found_nothing.append(1)
            barrier.wait(timeout=30)
        return earlier

    monkeypatch.setattr(Journal, "_earlier", looked_together)
    return found_nothing


def _append_in_process(url: str, writer: str, env: dict[str, str], out: Any) -> None:
    try:
        with Journal.open(url, env=env) as journal:
            committed = journal.append(_batch(writer), batch="req42")
        out.send(("ok", _as_pairs(committed)))
    except BatchCommittedError as e:
        out.send(("refused", e.positions))
    except BaseException as e:  # reported to the test, never lost in the child
        out.send(("error", repr(e)))
    finally:
        out.close()


def _race(
    url: str, how: str, writers: list[str], env: dict[str, str], barrier: Any
) -> list[tuple[str, Any]]:
    """Every writer appends its batch with the id req42 at once, in threads (each its
    own Journal) or in processes."""
    if how == "threads":
        journals = [Journal.open(url, env=env) for _ in writers]

        def one(journal: Journal, writer: str) -> tuple[str, Any]:
            try:
                return "ok", _as_pairs(journal.append(_batch(writer), batch="req42"))
            except BatchCommittedError as e:
                return "refused", e.positions

        try:
            with ThreadPoolExecutor(len(writers)) as pool:
                futures = [pool.submit(one, j, w) for j, w in zip(journals, writers, strict=True)]
                return [f.result(timeout=60) for f in futures]
        finally:
            for journal in journals:
                journal.close()
    results = []
    children = []
    for writer in writers:
        receive, send = FORK.Pipe(duplex=False)
        child = FORK.Process(target=_append_in_process, args=(url, writer, env, send))
        child.start()
        send.close()
        children.append((child, receive))
    for child, receive in children:
        assert receive.poll(60), "a writer process did not answer"
        results.append(receive.recv())
        child.join(30)
    return results


@pytest.mark.parametrize("how", ["threads", "processes"])
@pytest.mark.parametrize("group_commit", ["on", "off"])
def test_appends_racing_with_one_id_commit_it_once(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch, how: str, group_commit: str
) -> None:
    """Both appends looked for an earlier batch with the id and found none (held until
    both had looked), so the look cannot have stopped the second: the index's key
    does, under the write lock, whether each batch commits alone or they share a group
    commit. Each caller is handed exactly the journaled entries of the batch."""
    _, url, _ = shared
    barrier = threading.Barrier(2) if how == "threads" else FORK.Barrier(2)
    found_nothing = _past_the_check_together(monkeypatch, 2, barrier)
    results = _race(url, how, ["same", "same"], {"GROUP_COMMIT": group_commit}, barrier)
    if how == "threads":
        assert len(found_nothing) == 2  # both looks came before either commit
    journaled = _journaled(url, "req42")
    assert len(journaled) == 3
    assert results == [("ok", journaled), ("ok", journaled)]
    assert _pings(url) == [("same", 0, n, pos) for n, (pos, _) in enumerate(journaled)]
    with Journal.open(url, read_only=True) as journal:
        assert audit_journal(journal).ok


@pytest.mark.parametrize("how", ["threads", "processes"])
def test_other_requests_racing_with_one_id_commit_one_and_refuse_the_other(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Two different requests under one id: one commits, the other is refused with
    BatchCommittedError naming where that id committed; it is never handed the other
    request's entries as if they were its own."""
    _, url, _ = shared
    barrier = threading.Barrier(2) if how == "threads" else FORK.Barrier(2)
    _past_the_check_together(monkeypatch, 2, barrier)
    results = _race(url, how, ["a", "b"], {}, barrier)
    journaled = _journaled(url, "req42")
    span = (journaled[0][0], journaled[-1][0])
    assert sorted(kind for kind, _ in results) == ["ok", "refused"]
    assert ("ok", journaled) in results
    assert ("refused", span) in results
    assert len({writer for writer, *_ in _pings(url)}) == 1


def test_appends_with_one_id_in_the_same_group_commit_commit_it_once(
    shared: tuple[Path, str, str],
) -> None:
    """Both batches wait in the spool while the turn is held, so one leader commits
    them in one transaction: the second is refused by the key inside it (its savepoint
    rolled back alone) and its writer is answered with the first one's entries."""
    db, url, _ = shared
    journals = [Journal.open(url) for _ in range(3)]
    try:
        with _turn_held(db) as release, ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(j.append, _batch("same"), batch="req42") for j in journals[:2]]
            other = pool.submit(journals[2].append, _batch("bystander"), batch="req7")
            _waiting(db, 3)  # all three looked (found nothing) and wait in the spool
            release()
            results = [_as_pairs(f.result(timeout=60)) for f in futures]
            bystander = _as_pairs(other.result(timeout=60))
    finally:
        for journal in journals:
            journal.close()
    journaled = _journaled(url, "req42")
    assert results == [journaled, journaled]
    assert bystander == _journaled(url, "req7")  # the rest of the group is whole
    assert len(_pings(url)) == 6


# -- lookups are index reads ---------------------------------------------------------------


def _plan(url: str, query: str, params: tuple[Any, ...]) -> str:
    with _raw(url) as conn:
        if url.startswith("sqlite"):
            rows = conn.execute(f"EXPLAIN QUERY PLAN {query}", params).fetchall()
            return "\n".join(str(r[-1]) for r in rows)
        rows = conn.execute(f"EXPLAIN {query}", params).fetchall()
        return "\n".join(str(r[0]) for r in rows)


def _best_of(n: int, action: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(n):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def test_a_lookup_by_id_at_100k_entries_is_an_index_read(journal_url: str) -> None:
    with Journal.create(journal_url) as journal:
        for b in range(1000):
            journal.append(
                [Ping(writer="bulk", batch=b, n=i) for i in range(100)], batch=f"bulk{b}"
            )
        assert journal.head()[0] == 100_000  # type: ignore[index]
        middle = journal.batch_entries("bulk500")
        assert [e.position for e in middle] == list(range(50_001, 50_101))
        assert {e.event.batch for e in middle} == {500}  # type: ignore[attr-defined]
        lookup = _best_of(5, lambda: journal.batch_entries("bulk500"))
        # Positive control: the scan the lookup was before (what a journal made before
        # the index, opened read-only, still does) reads every entry.
        scan = _best_of(2, lambda: journal._scanned_batch("bulk500"))
        assert [r.position for r in journal._scanned_batch("bulk500")] == list(
            range(50_001, 50_101)
        )
    assert lookup * 20 < scan, (lookup, scan)
    sqlite = journal_url.startswith("sqlite")
    p = "?" if sqlite else "%s"
    # SQLite: the recorder's own statement; PostgreSQL: the store's, spelled out.
    by_id = _plan(
        journal_url,
        _sqlite._BATCH_RANGE
        if sqlite
        else "SELECT first_position, last_position FROM charter_batches WHERE batch = %s",
        ("bulk500",),
    )
    table, pos = ("stored_events", "rowid") if sqlite else ("charter_events", "notification_id")
    by_range = _plan(
        journal_url,
        f"SELECT * FROM {table} WHERE {pos} >= {p} AND {pos} <= {p} ORDER BY {pos}",
        (50_001, 50_100),
    )
    if sqlite:
        assert "SEARCH charter_batches USING PRIMARY KEY (batch=?)" in by_id, by_id
        assert "SEARCH stored_events USING INTEGER PRIMARY KEY" in by_range, by_range
    else:
        assert "Index" in by_id, by_id
        assert "charter_batches_pkey" in by_id, by_id
        assert "Seq Scan" not in by_range, by_range
        assert "Index" in by_range, by_range


# -- journals made before the index --------------------------------------------------------


def _drop_index(url: str) -> None:
    """What a journal made before the batch index looks like: no charter_batches."""
    with _raw(url) as conn:
        conn.execute("DROP TABLE charter_batches")
        conn.commit()


def _has_index(url: str) -> bool:
    with _raw(url) as conn:
        if url.startswith("sqlite"):
            q = "SELECT 1 FROM sqlite_master WHERE name = 'charter_batches'"
            return conn.execute(q).fetchone() is not None
        return conn.execute("SELECT to_regclass('charter_batches')").fetchone()[0] is not None


def test_a_journal_made_before_the_index_gets_it_at_its_first_append(journal_url: str) -> None:
    with Journal.create(journal_url) as journal:
        old = journal.append(_batch("old"), batch="old1")
        journal.append([Ping(writer="old", batch=1, n=0)], batch="old2")
    _drop_index(journal_url)
    # Read-only: still answers (by a scan), and makes nothing.
    with Journal.open(journal_url, read_only=True) as journal:
        assert [(e.position, e.hash) for e in journal.batch_entries("old1")] == _as_pairs(old)
    assert not _has_index(journal_url)
    with Journal.open(journal_url) as journal:
        # The first append makes the index from the entries' ids, under the write lock.
        assert journal.append(_batch("old"), batch="old1") == old  # a retry, answered
        assert _has_index(journal_url)
        with pytest.raises(BatchCommittedError):
            journal.append(_batch("new"), batch="old2")
        new = journal.append(_batch("new"), batch="new1")
    with _raw(journal_url) as conn:
        index = {
            r[0]: (r[1], r[2])
            for r in conn.execute(
                "SELECT batch, first_position, last_position FROM charter_batches"
            ).fetchall()
        }
    assert index == {
        "old1": (1, 3),
        "old2": (4, 4),
        "new1": (new[0].position, new[-1].position),
    }


def test_the_index_of_an_old_journal_keeps_each_ids_first_run() -> None:
    """Two appends that raced with one id before the index existed both committed; the
    index built later names the first (the later one stays: the journal is
    append-only). Entries without an id (written before batch ids) are skipped."""

    def state(batch: str | None) -> bytes:
        mark = f',"batch":"{batch}"' if batch else ""
        return (
            b'{"at":"' + b"2026-12-01T00:00:00.000000+00:00" + f'"{mark},"payload":{{}}}}'.encode()
        )

    rows = [(1, state("a")), (2, state("a")), (3, state(None)), (4, state("b")), (5, state("a"))]
    rows += [(6, state("a")), (7, state("c")), (9, state("c"))]
    assert batch_runs(rows) == [("a", 1, 2), ("b", 4, 4), ("c", 7, 7)]


def test_without_the_index_row_the_same_race_commits_twice(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positive control for the races above: with the recorders made to skip the index
    row (what every append did before), the same two appends both commit, so the
    races above do reach the commit and it is the index's key that stops the second."""
    from charter.ledger import _postgres

    _, url, _ = shared
    monkeypatch.setattr(_sqlite, "batch_of", lambda events: None)
    monkeypatch.setattr(_postgres, "batch_of", lambda events: None)
    barrier = threading.Barrier(2)
    _past_the_check_together(monkeypatch, 2, barrier)
    results = _race(url, "threads", ["same", "same"], {"GROUP_COMMIT": "off"}, barrier)
    assert [kind for kind, _ in results] == ["ok", "ok"]
    assert results[0][1] != results[1][1]
    assert len(_pings(url)) == 6  # two batches under one id: the bug this index fixes


def test_an_index_row_naming_other_entries_is_refused_not_believed(journal_url: str) -> None:
    """The index is outside the chain: a row planted to name another append's entries
    (or positions past the head) under some id makes a lookup of that id fail closed,
    never hand those entries over or let an append under it commit."""
    with Journal.create(journal_url) as journal:
        mine = journal.append(_batch("w"), batch="req1")
    p = "?" if journal_url.startswith("sqlite") else "%s"
    with _raw(journal_url) as conn:
        conn.execute(f"INSERT INTO charter_batches VALUES ({p}, {p}, {p})", ("forged", 1, 3))
        conn.execute(f"INSERT INTO charter_batches VALUES ({p}, {p}, {p})", ("ahead", 90, 99))
        conn.commit()
    with Journal.open(journal_url) as journal:
        for planted in ("forged", "ahead"):
            with pytest.raises(StateError, match="batch index names positions"):
                journal.batch_entries(planted)
            with pytest.raises(StateError, match="batch index names positions"):
                journal.append(_batch("w"), batch=planted)
        head = journal.head()
        # Positive control: the real row is believed, and a new id appends.
        assert _as_pairs(tuple(journal.append(_batch("w"), batch="req1"))) == _as_pairs(mine)
        assert journal.head() == head
        assert journal.append(_batch("w"), batch="req2")


@pytest.mark.postgres
def test_an_old_journal_whose_writer_may_not_make_the_index_is_not_appended_to(
    pg_url: str,
) -> None:
    """Fail closed: a writer that may insert but not create tables cannot make the
    index of a journal made before it, so it appends nothing (rather than commit with
    no uniqueness). Once a user who may has made it, that writer appends."""
    Journal.create(pg_url).close()
    with Journal.open(pg_url) as journal:
        journal.append(_batch("old"), batch="old1")
    _drop_index(pg_url)
    role = f"charter_w_{uuid.uuid4().hex[:10]}"
    u = urlparse(pg_url)
    with _raw(pg_url) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        # What a writer needs (UPDATE for the table lock; the triggers refuse updates).
        rights = "SELECT, INSERT, UPDATE"
        conn.execute(f'GRANT {rights} ON ALL TABLES IN SCHEMA public TO "{role}"')
        conn.execute(f'ALTER DEFAULT PRIVILEGES GRANT {rights} ON TABLES TO "{role}"')
        conn.execute(f'REVOKE CREATE ON SCHEMA public FROM PUBLIC, "{role}"')
        conn.commit()
    limited = f"postgresql://{role}@{u.hostname}:{u.port}{u.path}"
    try:
        with Journal.open(limited) as journal:
            head = journal.head()
            with pytest.raises(AppendFailedError, match="no batch index") as caught:
                journal.append(_batch("new"), batch="new1")
            assert "permission denied for schema public" in str(caught.value)
            assert journal.head() == head
            assert not _has_index(pg_url)
        # Positive control: the owner's first append makes it; then the writer appends.
        with Journal.open(pg_url) as journal:
            journal.append([Ping(writer="owner", batch=0, n=0)])
        with Journal.open(limited) as journal:
            assert journal.append(_batch("new"), batch="new1")
            assert journal.append(_batch("old"), batch="old1")[0].position == 1
    finally:
        with _raw(pg_url) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
            conn.commit()
