"""The SQLite writers' turn: a lock file beside the journal that every Charter writer
takes (``flock``) before ``BEGIN IMMEDIATE``, holding the head hint they share.

Why (docs/decisions/0006): SQLite has no queue for its write lock. A writer that finds
it taken sleeps in its busy handler (1, 2, 5, … 100 ms) and polls, so with 16 writers
the lock sat free most of the time while its next owner slept, and 16 processes
appended half as fast as one. ``flock`` queues waiters in the kernel and wakes the next
one as the holder releases it, so the turn passes in microseconds. The database lock
is still taken (and still decides): the turn only orders Charter's own writers.

The head hint (position, hash, commit time of the last entry a writer committed) lives
in the same file, written after each commit, so every writer chains onto the real head
without reading it, however many writers there are. It is only a hint: a stale one
makes the first insert conflict (on the position) and the recorder reads the head under
the lock instead; it is never ahead of the journal because it is written only after
the commit and entries cannot be deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from eventsourcing.persistence import OperationalError

from charter.ledger._rows import Head, WriteLockTimeoutError

__all__ = ["ProcessLock", "WriterTurn"]

_HINT = struct.Struct(">q32s32s")  # position, chain hash, commit time (32 bytes of ISO)


class ProcessLock:
    """A lock for the threads of one process, made anew in a forked child: a thread of
    the parent may have held it at the fork, and would never let it go there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


_opening = ProcessLock()  # held while a thread opens a turn's file (WriterTurn._file)


class WriterTurn:
    """One process's handle on the turn file ``<journal>-writer``. One thread of the
    process at a time holds it (``flock`` belongs to the open file, which the threads
    share, so the kernel alone would let them all in at once)."""

    def __init__(self, journal: Path) -> None:
        self.path = Path(f"{journal}-writer")
        self._fd: int | None = None
        self._pid = 0
        self._threads = threading.Lock()
        self._waiter_thread: _Waiter | None = None

    def _file(self) -> int:
        # A forked child must not share its parent's open file description: flock
        # belongs to that description, so parent and child would hold the turn as one.
        if self._fd is not None and self._pid == os.getpid():
            return self._fd
        # One thread opens it; the others wait and take that one. Two threads that both
        # found no file open each opened one: two open file descriptions in one process,
        # whose locks exclude each other, and a lock taken through the first but let go
        # through the second (``release`` unlocks ``self._fd``) stayed held for good, so
        # every later writer waited the whole lock timeout (WriterStalledError).
        with _opening:
            if self._fd is not None and self._pid == os.getpid():
                return self._fd
            try:  # whoever may write the journal may take the turn: its mode, via umask
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError as e:
                raise OperationalError(
                    f"cannot open the writers' turn file {self.path}: {e}"
                ) from e
            self._threads = threading.Lock()  # a parent's thread may have held it at fork
            self._waiter_thread = None  # threads do not survive a fork
            self._fd = fd
            self._pid = os.getpid()  # last: the look above takes the file only then
        return fd

    def try_take(self) -> bool:
        """Take the turn if it is free right now (never waits)."""
        fd = self._file()
        if not self._threads.acquire(blocking=False):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._threads.release()
            return False
        return True

    def take(self, deadline: float) -> None:
        """Wait for the turn until ``deadline`` (``time.monotonic()``), then
        WriteLockTimeoutError."""
        fd = self._file()
        if not self._threads.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise WriteLockTimeoutError(
                "this process has waited for the journal's write turn for the whole lock "
                "timeout (another writer may be stalled holding it)"
            )
        try:
            _acquire(
                fd,
                deadline,
                self._waiter,
                # An abandoned wait still ends in the kernel's queue: until it has got and
                # let go the lock, no other thread of this process may take the turn (the
                # unlock would be theirs too: it belongs to the shared open file).
                abandoned=self._threads.release,
            )
        except WriteLockTimeoutError:
            raise
        except BaseException:
            self._threads.release()
            raise

    def _waiter(self) -> _Waiter:
        if self._waiter_thread is None:
            self._waiter_thread = _Waiter()
        return self._waiter_thread

    def release(self) -> None:
        fcntl.flock(self._file(), fcntl.LOCK_UN)
        self._threads.release()

    def hint(self) -> tuple[Head | None, bool]:
        """The head the last writer committed (only while holding the turn), and
        whether any writer has ever waited in the spool (:meth:`spool_used`)."""
        data = os.pread(self._file(), _HINT.size + 1, 0)
        used = len(data) > _HINT.size and data[_HINT.size] != 0
        if len(data) < _HINT.size:
            return None, used
        position, chain, stamp = _HINT.unpack(data[: _HINT.size])
        return (Head(position, chain, stamp) if position > 0 else None), used

    def spool_used(self) -> bool:
        """Whether any writer has ever left a batch in the spool. A writer sets it
        before its first batch there (:meth:`mark_spool_used`) and it is never unset,
        so a journal that never had a waiting writer costs its lone writer no look at
        the spool: one byte of the turn file, read with the hint."""
        return os.pread(self._file(), 1, _HINT.size) not in (b"", b"\0")

    def mark_spool_used(self) -> None:
        os.pwrite(self._file(), b"\1", _HINT.size)

    def set_hint(self, head: Head | None) -> None:
        """Record the head just committed (or forget it: None)."""
        if head is None or head.stamp is None or len(head.stamp) != 32:
            os.pwrite(self._file(), _HINT.pack(0, bytes(32), bytes(32)), 0)
            return
        os.pwrite(self._file(), _HINT.pack(head.position, head.hash, head.stamp), 0)

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None


class _Waiter:
    """The thread of this process that waits in the kernel's queue for the turn, so a
    caller can give up at its deadline (``flock`` itself has no timeout). Long-lived:
    starting a thread per wait cost ~110 us, a hand-off to this one ~60 us."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Wait] = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True, name="charter-writer-turn").start()

    def _serve(self) -> None:
        while True:
            self._jobs.get().run()

    def wait(self, job: _Wait) -> None:
        self._jobs.put(job)


class _Wait:
    """One wait for the lock: ``got`` once it is held for the caller; if the caller
    gave up first (``abandon``), the lock is released as soon as it comes and then
    ``abandoned`` is called."""

    def __init__(self, fd: int, abandoned: Callable[[], None]) -> None:
        self.fd, self._abandoned = fd, abandoned
        self.got = threading.Event()
        self._guard = threading.Lock()
        self._given_up = False

    def run(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        with self._guard:
            if not self._given_up:
                self.got.set()
                return
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self._abandoned()

    def abandon(self) -> bool:
        """Give up; False if the lock was got meanwhile (the caller holds it)."""
        with self._guard:
            if self.got.is_set():
                return False
            self._given_up = True
            return True


def _acquire(
    fd: int, deadline: float, waiter: Callable[[], _Waiter], *, abandoned: Callable[[], None]
) -> None:
    """``flock(LOCK_EX)`` until ``deadline``: at once if free, else the turn's waiter
    thread blocks in the kernel's queue for it (no polling) while the caller waits at
    most until the deadline; a lock got after the caller gave up is released at once,
    and then ``abandoned`` is called."""
    with contextlib.suppress(BlockingIOError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    job = _Wait(fd, abandoned)
    started = time.monotonic()
    waiter().wait(job)
    if job.got.wait(max(0.0, deadline - started)) or not job.abandon():
        return
    raise WriteLockTimeoutError(
        f"another writer has held the journal's write turn for {time.monotonic() - started:.0f} s "
        "(the lock timeout); it may be stalled"
    )
