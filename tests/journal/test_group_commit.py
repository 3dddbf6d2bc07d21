"""Group commit (docs/decisions/0007 and 0008), on SQLite and on PostgreSQL: writers
that find the turn taken leave their batch in the spool, and the next holder commits
them all in one transaction. Shown here: the group forms; a refused batch leaves the others whole;
hostile bytes in the spool are skipped; a leader killed before or after its commit
leaves every waiting writer with its batch committed exactly once; a leader stalled
holding a claimed batch gives that writer OutcomeUnknownError naming the batch; a
forged answer is not believed. Every case ends with the auditor's independent fold."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import select
import signal
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from charter.audit.journal import audit_journal
from charter.core.errors import BadInputError
from charter.ledger import (
    AppendConflictError,
    HeadPinLostError,
    Journal,
    OutcomeUnknownError,
    _group,
    _postgres,
    _sqlite,
)
from charter.ledger._spool import Answer, Request, Spool
from tests.journal._support import Counter, Gathering, Ping

FORK = multiprocessing.get_context("fork")


@contextmanager
def _turn_held(db: Path) -> Iterator[Callable[[], None]]:
    """Hold the writers' turn (as a writer of another process would); yields release."""
    fd = os.open(f"{db}-writer", os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    held = [True]

    def release() -> None:
        if held[0]:
            fcntl.flock(fd, fcntl.LOCK_UN)
            held[0] = False

    try:
        yield release
    finally:
        release()
        os.close(fd)


def _waiting(db: Path, n: int, *, timeout: float = 30) -> list[str]:
    """The writers whose batch waits in the spool, once there are ``n`` of them."""
    spool = Path(f"{db}-spool")
    deadline = time.monotonic() + timeout
    while True:
        names = []
        for pipe in spool.glob("*.in") if spool.is_dir() else []:
            if pipe.is_fifo():
                fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    poll = select.poll()
                    poll.register(fd, select.POLLIN)
                    if any(ev & select.POLLIN for _, ev in poll.poll(0)):
                        names.append(pipe.name.removesuffix(".in"))
                finally:
                    os.close(fd)
        if len(names) >= n:
            return names
        assert time.monotonic() < deadline, f"only {len(names)} of {n} batches waiting"
        time.sleep(0.01)


def _nudge(db: Path, pid: int) -> None:
    """Wake the writer of process ``pid`` (as a holder that let the turn go does)."""
    (out,) = Path(f"{db}-spool").glob(f"{pid}-*.out")
    fd = os.open(out, os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"\0")
    os.close(fd)


def _new_journal(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "j.db"
    url = f"sqlite:///{db}"
    Journal.create(url).close()
    return db, url


RECORDERS: dict[str, Any] = {
    "sqlite": _sqlite.ChainedSQLiteApplicationRecorder,
    "postgres": _postgres.ChainedPostgresApplicationRecorder,
}
LOCK_TIMEOUT = {"sqlite": "SQLITE_LOCK_TIMEOUT", "postgres": "POSTGRES_LOCK_TIMEOUT"}


@pytest.fixture
def shared(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, str, str]:
    """A new journal of the backend: the place its turn and spool are named after (the
    journal file; for PostgreSQL a file in this user's private directory), its URL."""
    if backend == "sqlite":
        db, url = _new_journal(tmp_path)
        return db, url, backend
    url = str(request.getfixturevalue("pg_url"))
    Journal.create(url).close()
    with Journal.open(url) as journal:
        place = journal._writer()[0].events.recorder._spool_place()
    return place, url, backend


def _pings(journal: Journal) -> list[tuple[str, int]]:
    return [(e.event.writer, e.position) for e in journal.entries() if isinstance(e.event, Ping)]


def _count_groups(monkeypatch: pytest.MonkeyPatch, backend: str) -> list[int]:
    sizes: list[int] = []
    recorder = RECORDERS[backend]
    commit_group = recorder._commit_group

    def counting(self: Any, own: Any, waiting: Any, *rest: Any) -> Any:
        sizes.append((own is not None) + len(waiting))
        return commit_group(self, own, waiting, *rest)

    monkeypatch.setattr(recorder, "_commit_group", counting)
    return sizes


def _plant_hostile_writers(db: Path) -> int:
    """A pipe of garbage, a regular file and a symlink where batches wait."""
    spool = Path(f"{db}-spool")
    spool.mkdir(exist_ok=True)
    os.mkfifo(spool / "evil.in")
    os.mkfifo(spool / "evil.out")
    fd = os.open(spool / "evil.in", os.O_RDWR | os.O_NONBLOCK)
    os.write(fd, b"CHARTER-SPOOL-REQ-3\n" + b"\xff" * 64)
    (spool / "plain.in").write_bytes(b"not a pipe")
    (spool / "link.in").symlink_to("/etc/passwd")
    return fd


def test_writers_waiting_for_the_turn_commit_in_one_group(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, url, backend = shared
    groups = _count_groups(monkeypatch, backend)
    journals = [Journal.open(url) for _ in range(8)]
    with _turn_held(db) as release, ThreadPoolExecutor(8) as pool:
        hostile = _plant_hostile_writers(db)
        futures = [
            pool.submit(j.append, [Ping(writer=f"w{i}", batch=0, n=0)])
            for i, j in enumerate(journals)
        ]
        _waiting(db, 9)  # eight writers and the hostile pipe
        release()
        results = [f.result(timeout=60) for f in futures]
    os.close(hostile)
    # One writer took the turn and committed its batch and the seven others at once.
    assert max(groups) == 8, groups
    positions = sorted(r[0].position for r in results)
    assert positions == list(range(positions[0], positions[0] + 8))
    with Journal.open(url, read_only=True) as journal:
        assert sorted(_pings(journal)) == sorted(
            (f"w{i}", r[0].position) for i, r in enumerate(results)
        )
        report = audit_journal(journal)
        assert report.ok, report
    for j in journals:
        j.close()


def test_a_refused_batch_leaves_the_rest_of_its_group_whole(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, url, backend = shared
    groups = _count_groups(monkeypatch, backend)
    journals = [Journal.open(url) for _ in range(6)]
    counters = [Counter(name="c", value=v) for v in (1, 2)]  # both decided on version 0
    with _turn_held(db) as release, ThreadPoolExecutor(6) as pool:
        futures = [
            pool.submit(journals[i].append, [counters[i]], expect={"counter:c": 0})
            for i in range(2)
        ] + [
            pool.submit(journals[i].append, [Ping(writer=f"w{i}", batch=0, n=0)])
            for i in range(2, 6)
        ]
        _waiting(db, 6)
        release()
        outcomes: list[Any] = []
        for f in futures:
            try:
                outcomes.append(f.result(timeout=60))
            except AppendConflictError as e:
                outcomes.append(e)
    assert max(groups) == 6, groups
    refused = [o for o in outcomes[:2] if isinstance(o, AppendConflictError)]
    assert len(refused) == 1  # the second decision on version 0 is stale: refused
    assert all(not isinstance(o, Exception) for o in outcomes[2:])
    with Journal.open(url, read_only=True) as journal:
        assert len(_pings(journal)) == 4
        assert [e.event.value for e in journal.entries() if isinstance(e.event, Counter)] in (
            [1],
            [2],
        )
        report = audit_journal(journal)
        assert report.ok, report
    for j in journals:
        j.close()


def test_writers_pinned_to_one_head_in_one_group_commit_exactly_one(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five writers decided on the same head wait in the spool; one leads and commits
    its own batch and the four others in one transaction, each checked under the lock
    against the head as that transaction sees it: the first commits right after the
    head, the others are refused alone (their savepoint), nothing of theirs written."""
    db, url, backend = shared
    groups = _count_groups(monkeypatch, backend)
    journals = [Journal.open(url) for _ in range(5)]
    journals[0].append([Ping(writer="first", batch=0, n=0)])
    read = journals[0].head()[0]  # type: ignore[index]
    outcomes: list[Any] = []
    with _turn_held(db) as release, ThreadPoolExecutor(5) as pool:
        futures = [
            pool.submit(j.append, [Ping(writer=f"w{i}", batch=0, n=0)], expect_head=read)
            for i, j in enumerate(journals)
        ]
        _waiting(db, 5)
        release()
        for f in futures:
            try:
                outcomes.append(f.result(timeout=60))
            except HeadPinLostError as e:
                outcomes.append(e)
    assert max(groups) == 5, groups  # one group: the pins went through the spool
    committed = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(committed) == 1
    assert [c.position for c in committed[0]] == [read + 1]
    assert sum(isinstance(o, HeadPinLostError) for o in outcomes) == 4
    with Journal.open(url, read_only=True) as journal:
        assert journal.head() == (read + 1, committed[0][0].hash)
    for j in journals:
        j.close()
    with Journal.open(url, read_only=True) as journal:
        report = audit_journal(journal)
        assert report.ok, report


def test_a_pinned_batch_waiting_behind_a_commit_loses_to_it(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain batch and a pinned one wait in the spool together; whichever leads, the
    pinned one commits only if it is first in the group (then at the head it read),
    else it is refused: never committed after an entry it did not read."""
    db, url, backend = shared
    groups = _count_groups(monkeypatch, backend)
    plain, pinned = Journal.open(url), Journal.open(url)
    plain.append([Ping(writer="first", batch=0, n=0)])
    read = plain.head()[0]  # type: ignore[index]
    with _turn_held(db) as release, ThreadPoolExecutor(2) as pool:
        a = pool.submit(plain.append, [Ping(writer="plain", batch=0, n=0)])
        b = pool.submit(pinned.append, [Counter(name="c", value=1)], expect_head=read)
        _waiting(db, 2)
        release()
        plain_done = a.result(timeout=60)
        try:
            pinned_done: Any = b.result(timeout=60)
        except HeadPinLostError as e:
            pinned_done = e
    assert max(groups) == 2, groups
    if isinstance(pinned_done, Exception):
        assert [c.position for c in plain_done] == [read + 1]
    else:
        assert [c.position for c in pinned_done] == [read + 1]
        assert [c.position for c in plain_done] == [read + 2]
    plain.close()
    pinned.close()
    with Journal.open(url, read_only=True) as journal:
        report = audit_journal(journal)
        assert report.ok, report


def _waiter(url: str, writer: str, nap: float, env: dict[str, str], out: Any) -> None:
    """A writer process: append one ping, report its position or its error."""
    _group._NAP_S = nap  # sleeps until answered or nudged (so the test picks the leader)
    with Journal.open(url, env=env) as journal:
        try:
            out.put((writer, journal.append([Ping(writer=writer, batch=0, n=0)])[0].position))
        except Exception as e:  # reported to the test, which asserts on it
            out.put((writer, (type(e).__name__, getattr(e, "batch", None), str(e))))


def _leader(url: str, backend: str, moment: str, out: Any) -> None:
    """A writer process that, leading a group, dies (or stalls) at ``moment``."""
    _group._NAP_S = 60.0
    recorder = RECORDERS[backend]
    commit_group = recorder._commit_group

    def dying(self: Any, own: Any, waiting: Any, *rest: Any) -> Any:
        if waiting and moment == "before-commit":
            os.kill(os.getpid(), signal.SIGKILL)
        if waiting and moment == "stalled":
            time.sleep(3600)
        return commit_group(self, own, waiting, *rest)

    def answer_then_die(*args: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    recorder._commit_group = dying  # type: ignore[method-assign,assignment]
    if moment == "after-commit":
        Spool.reply = answer_then_die  # type: ignore[method-assign,assignment]
    _waiter(url, "leader", 60.0, {}, out)


def _start(target: Callable[..., None], *args: Any) -> Any:
    process = FORK.Process(target=target, args=args, daemon=True)
    process.start()
    return process


@pytest.mark.parametrize("moment", ["before-commit", "after-commit"])
def test_a_leader_killed_with_batches_waiting_leaves_each_committed_once(
    shared: tuple[Path, str, str], moment: str
) -> None:
    db, url, backend = shared
    out = FORK.Queue()
    with _turn_held(db) as release:
        waiters = [_start(_waiter, url, f"w{i}", 2.0, {}, out) for i in range(4)]
        _waiting(db, 4)
        leader = _start(_leader, url, backend, moment, out)
        _waiting(db, 5)
        release()
        _nudge(db, leader.pid)
        leader.join(60)
        assert leader.exitcode == -signal.SIGKILL  # it died leading the group
        results = dict(out.get(timeout=60) for _ in waiters)
    for w in waiters:
        w.join(60)
    assert all(isinstance(p, int) for p in results.values()), results
    with Journal.open(url, read_only=True) as journal:
        pings = _pings(journal)
        assert sorted(p for p in pings if p[0] != "leader") == sorted(results.items())
        leader_entries = [p for p in pings if p[0] == "leader"]
        assert len(leader_entries) == (1 if moment == "after-commit" else 0)
        report = audit_journal(journal)
        assert report.ok, report


def test_a_leader_stalled_with_a_claimed_batch_is_outcome_unknown(
    shared: tuple[Path, str, str],
) -> None:
    db, url, backend = shared
    out = FORK.Queue()
    with _turn_held(db) as release:
        waiter = _start(_waiter, url, "w", 1.0, {LOCK_TIMEOUT[backend]: "2"}, out)
        _waiting(db, 1)
        leader = _start(_leader, url, backend, "stalled", out)
        _waiting(db, 2)
        release()
        _nudge(db, leader.pid)
        try:
            _, error = out.get(timeout=60)
        finally:
            leader.kill()
            leader.join(60)
    waiter.join(60)
    kind, batch, message = error
    assert kind == OutcomeUnknownError.__name__, error
    assert batch
    assert f"journal show --batch {batch}" in message
    with Journal.open(url, read_only=True) as journal:
        assert _pings(journal) == []  # claimed by the stalled leader, never committed
        report = audit_journal(journal)
        assert report.ok, report


def test_a_forged_answer_is_not_believed(shared: tuple[Path, str, str]) -> None:
    db, url, _ = shared
    with Journal.open(url) as journal:
        (first,) = journal.append([Ping(writer="first", batch=0, n=0)])
    out = FORK.Queue()
    with _turn_held(db) as release:
        waiter = _start(_waiter, url, "w", 60.0, {}, out)
        (name,) = _waiting(db, 1)
        spool = Path(f"{db}-spool")
        # The attacker takes the batch out of the spool and answers for it: "committed
        # at position 1" (a real entry, with its real hash, but not this batch).
        fd = os.open(spool / f"{name}.in", os.O_RDONLY | os.O_NONBLOCK)
        request = Request.decode(os.read(fd, 1 << 16))
        os.close(fd)
        forged = Answer(request.ticket, (first.position,), (first.hash,), bytes(32), None)
        release()
        fd = os.open(spool / f"{name}.out", os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, forged.encode())  # wakes the writer, which checks it and leads
        os.close(fd)
        _, position = out.get(timeout=60)
    waiter.join(60)
    assert position != first.position
    with Journal.open(url, read_only=True) as journal:
        assert _pings(journal) == [("first", 1), ("w", position)]  # its own writer, once
        report = audit_journal(journal)
        assert report.ok, report


def test_threads_sharing_one_journal_wait_their_turn(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads of one process share its pipes: one batch of the process waits in the
    spool at a time, the others queue for the turn; none is lost or doubled, and the
    waiting one is committed by whichever thread leads (not after a nap: naps are an
    hour long here)."""
    monkeypatch.setattr(_group, "_NAP_S", 3600.0)
    db, url, _ = shared
    with Journal.open(url) as journal, ThreadPoolExecutor(6) as pool:
        with _turn_held(db) as release:
            futures = [
                pool.submit(journal.append, [Ping(writer=f"t{i}", batch=0, n=0)]) for i in range(6)
            ]
            _waiting(db, 1)
            release()
        positions = sorted(f.result(timeout=30)[0].position for f in futures)
        assert positions == list(range(1, 7))
        assert sorted(w for w, _ in _pings(journal)) == [f"t{i}" for i in range(6)]
        report = audit_journal(journal)
        assert report.ok, report
    assert list(Path(f"{db}-spool").iterdir()) == []  # closing the journal removed its pipes


def test_threads_first_writing_at_once_make_one_turn_and_spool(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads whose appends are a journal's first, all at once, make its turn and
    spool once: each thread that found none made its own, held the turn through its own
    open file (they exclude each other) and let it go through another's, so it stayed
    taken and the next writer waited its whole lock timeout (WriterStalledError)."""
    _, url, _ = shared
    threads = 6
    inside = Gathering(threads, _group.SharedCommit._insert_shared.__code__)
    made: list[Path] = []

    class CountedTurn(_group.WriterTurn):
        def __init__(self, journal: Path) -> None:
            made.append(journal)
            inside.wait()  # every thread has looked whether the turn is made
            super().__init__(journal)

    monkeypatch.setattr(_group, "WriterTurn", CountedTurn)

    def append(i: int) -> int:
        inside.join()
        (entry,) = journal.append([Ping(writer=f"t{i}", batch=0, n=0)])
        return entry.position

    with Journal.open(url) as journal, ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(append, i) for i in range(threads)]
        positions = sorted(f.result(timeout=60) for f in futures)
        assert len(made) == 1  # one turn and spool for the recorder (before: one a thread)
        assert positions == list(range(1, threads + 1))
        (entry,) = journal.append([Ping(writer="after", batch=0, n=0)])  # the turn is free
        assert entry.position == threads + 1
        report = audit_journal(journal)
        assert report.ok, report


def test_the_spool_is_never_more_open_than_the_journal(tmp_path: Path) -> None:
    """Anyone who may put a batch in the spool has it committed: the spool gets the
    journal file's permissions, however lax the umask of the writer that makes it."""
    db, url = _new_journal(tmp_path)
    os.chmod(db, 0o640)
    old = os.umask(0)
    try:
        with Journal.open(url) as journal, ThreadPoolExecutor(1) as pool:
            with _turn_held(db) as release:
                future = pool.submit(journal.append, [Ping(writer="w", batch=0, n=0)])
                (name,) = _waiting(db, 1)
                spool = Path(f"{db}-spool")
                modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in spool.iterdir()}
                release()
            future.result(timeout=60)
    finally:
        os.umask(old)
    assert stat.S_IMODE(spool.stat().st_mode) == 0o750
    assert modes == {f"{name}.in": 0o640, f"{name}.out": 0o640}


def test_a_batch_whose_writer_died_waiting_is_never_committed(
    shared: tuple[Path, str, str],
) -> None:
    """A writer killed while its batch waits: the batch stays in its pipe as long as
    some leader holds the pipe open, but no leader commits it on behalf of nobody (it
    could land arbitrarily late); its pipes are removed."""
    db, url, _ = shared
    out = FORK.Queue()
    with _turn_held(db) as release:
        waiter = _start(_waiter, url, "dead", 60.0, {}, out)
        (name,) = _waiting(db, 1)
        spool = Path(f"{db}-spool")
        keeper = os.open(spool / f"{name}.in", os.O_RDONLY | os.O_NONBLOCK)  # as a leader would
        waiter.kill()
        waiter.join(60)
        release()
    try:
        with Journal.open(url) as journal:
            (entry,) = journal.append([Ping(writer="alive", batch=0, n=0)])
            assert _pings(journal) == [("alive", entry.position)]
            report = audit_journal(journal)
            assert report.ok, report
        assert sorted(p.name for p in spool.iterdir()) == []  # the dead writer's pipes too
    finally:
        os.close(keeper)


@pytest.mark.postgres
def test_postgres_writers_share_commits_only_through_a_private_place(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn and spool of a PostgreSQL journal have no journal file to live beside:
    they live in a directory only this user may enter. Where that directory is open to
    others (anyone could then put a batch in the spool, or answer for one), writers
    share nothing and each batch commits alone; the journal still works."""
    Journal.create(pg_url).close()
    shared_dir = tmp_path / "shared"
    (shared_dir / "charter").mkdir(parents=True)
    os.chmod(shared_dir / "charter", 0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared_dir))
    with Journal.open(pg_url) as journal:
        recorder = journal._writer()[0].events.recorder
        with pytest.raises(OSError, match="not a directory private to this user"):
            recorder._spool_place()
        (entry,) = journal.append([Ping(writer="alone", batch=0, n=0)])
        assert _pings(journal) == [("alone", entry.position)]
    assert list((shared_dir / "charter").iterdir()) == []  # nothing made in the open
    # Positive control: a private directory is used, with a private file in it.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(private))
    with Journal.open(pg_url) as journal:
        place = journal._writer()[0].events.recorder._spool_place()
        journal.append([Ping(writer="shared", batch=0, n=0)])
    assert place.parent == private / "charter"
    assert stat.S_IMODE((private / "charter").stat().st_mode) == 0o700
    assert stat.S_IMODE(place.stat().st_mode) == 0o600


@pytest.mark.parametrize("how", ["environment", "journal-env"])
def test_group_commit_switched_off_commits_every_batch_alone(
    shared: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """CHARTER_GROUP_COMMIT=off (or GROUP_COMMIT in the journal's env, issue 20 point
    7): no writer takes the turn or leaves its batch in the spool; each commits in a
    transaction of its own. Shown with the turn held by another writer the whole time:
    every batch still commits, one per transaction, and nothing waits in the spool."""
    db, url, backend = shared
    groups = _count_groups(monkeypatch, backend)
    env: dict[str, str] = {}
    if how == "environment":
        monkeypatch.setenv("CHARTER_GROUP_COMMIT", "off")
    else:
        env = {"GROUP_COMMIT": "off"}
    journals = [Journal.open(url, env=env) for _ in range(4)]
    with _turn_held(db), ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(j.append, [Ping(writer=f"w{i}", batch=b, n=0) for b in range(2)])
            for i, j in enumerate(journals)
        ]
        results = [f.result(timeout=60) for f in futures]
        assert not Path(f"{db}-spool").exists() or not list(Path(f"{db}-spool").iterdir())
    assert groups == [1, 1, 1, 1]
    for j in journals:
        j.close()
    with Journal.open(url, read_only=True) as journal:
        assert sorted(_pings(journal)) == sorted(
            (f"w{i}", c.position) for i, r in enumerate(results) for c in r
        )
        report = audit_journal(journal)
        assert report.ok, report
    # Positive control: with group commit on (the default), the same writer waits for
    # the held turn with its batch in the spool, and commits once the turn is free.
    monkeypatch.delenv("CHARTER_GROUP_COMMIT", raising=False)
    with Journal.open(url) as journal, _turn_held(db) as release, ThreadPoolExecutor(1) as pool:
        future = pool.submit(journal.append, [Ping(writer="grouped", batch=0, n=0)])
        _waiting(db, 1)
        assert not future.done()
        release()
        assert future.result(timeout=60)


def test_a_group_commit_setting_that_is_neither_on_nor_off_is_refused(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    Journal.create(sqlite_url).close()
    monkeypatch.setenv("CHARTER_GROUP_COMMIT", "of")
    with pytest.raises(BadInputError, match="neither on nor off"):
        Journal.open(sqlite_url)
    monkeypatch.setenv("CHARTER_GROUP_COMMIT", "on")  # positive control
    monkeypatch.setenv("GROUP_COMMIT", "of")  # not Charter's name: never read
    with Journal.open(sqlite_url) as journal:
        assert journal.append([Ping(writer="w", batch=0, n=0)])
