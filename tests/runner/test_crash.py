"""SIGKILL of the cell at random points of a 20-worker, two-level run: after a
restart no sandbox process survives, every scheduled worker ended (exited, failed or
killed), none started twice, leases and slots are all returned, the chain verifies and
the independent folds hold. ``CHARTER_CRASH_TRIALS`` sets the trials (default 30 on
SQLite, 5 on PostgreSQL)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest

from charter.app import Charter
from charter.audit import verify_chain
from charter.control import ResourceView
from charter.core import KeyStore, now_ms
from charter.runner.events import WorkerEnded, WorkerStarted
from charter.sandbox import SandboxLeased
from tests.conftest import PG_URL, _pg_admin, require_postgres
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import fan_out
from tests.runner.conftest import initialise
from tests.runner.programs import COORDINATOR, python

WT = Path(__file__).resolve().parents[2]
TRIALS = {"sqlite": 30, "postgres": 5}


def _cell(url: str, home: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": str(WT)}
    return subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", url, "--quiet", "cell", "run", "--once",
         "--ignore-host-load"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def _head(url: str, home: Path) -> int:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        head = charter.journal.head()
        return 0 if head is None else head[0]


def _alive(uids: set[int]) -> list[str]:
    """Processes (not zombies) running as any of ``uids``, as "pid uid state cmdline"."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if uid in uids and state != "Z":
                found.append(f"{entry} {uid} {state} {cmd[:80]!r}")
    return found


def _none_alive(uids: set[int], within: float = 10.0) -> list[str]:
    """Wait (up to ``within`` seconds) for the kernel to finish killing; what is left."""
    deadline = time.monotonic() + within
    while (alive := _alive(uids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _trial(url: str, home: Path, rng: random.Random) -> None:
    with initialise(url, home, processing=2, coordination=8) as charter:
        fan_out(charter, 4, python(COORDINATOR, "4"), fanout=40, depth=2)
        start = charter.journal.head()
    first = 0 if start is None else start[0]
    target = first + rng.randint(1, 140)
    cell = _cell(url, home)
    deadline = time.monotonic() + 120
    while cell.poll() is None and _head(url, home) < target:
        if time.monotonic() > deadline:
            cell.kill()
            pytest.fail("the cell made no progress to kill it at")
        time.sleep(0.01)
    cell.send_signal(signal.SIGKILL)
    cell.wait()
    again = _cell(url, home)
    try:
        _, err = again.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        again.kill()
        pytest.fail("the restarted cell did not finish")
    assert again.returncode == 0, err.decode()[-2000:]
    with Charter.open(url, keys=KeyStore(home)) as charter:
        entries = list(charter.journal.entries())
        uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}
        assert _none_alive(uids) == []
        started = [e.event.lineage for e in entries if isinstance(e.event, WorkerStarted)]
        assert len(started) == len(set(started))
        ended = {
            e.event.lineage: e.event.outcome for e in entries if isinstance(e.event, WorkerEnded)
        }
        assert set(ended.values()) <= {"exited", "failed", "lost", "killed"}
        history = journal_history(charter.journal)
        assert check_history(history).problems == []
        assert check_workers(history).problems == []
        assert check_settled(history).problems == []
        view = ResourceView()
        view.refresh(charter.journal)
        live = [x.lineage for x in view.book.ledgers() if x.parent and x.active(now_ms())]
        assert live == []
        verify_chain(charter.journal)


@contextmanager
def _journal(backend: str, tmp_path: Path, i: int) -> Iterator[str]:
    """A fresh journal URL for trial ``i``: a SQLite file, or a new PostgreSQL database."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / f'j{i}.db'}"
        return
    require_postgres()
    name = f"charter_t_{uuid.uuid4().hex[:12]}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    u = urlparse(PG_URL)
    try:
        yield f"postgresql://{u.username or 'postgres'}@{u.hostname}:{u.port or 5432}/{name}"
    finally:
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.slow
@pytest.mark.sandbox
def test_sigkill_of_the_cell_at_random_points(backend: str, tmp_path: Path) -> None:
    trials = int(os.environ.get("CHARTER_CRASH_TRIALS", TRIALS[backend]))
    seed = int(os.environ.get("CHARTER_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    for i in range(trials):
        with _journal(backend, tmp_path, i) as url:
            try:
                _trial(url, tmp_path / f"home{i}", rng)
            except AssertionError as e:
                raise AssertionError(f"trial {i} (seed {seed}): {e}") from e
