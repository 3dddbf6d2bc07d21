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
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from eventsourcing.persistence import OperationalError

from charter.ledger._rows import Head, WriteLockTimeoutError

__all__ = ["WriterTurn"]

_HINT = struct.Struct(">q32s32s")  # position, chain hash, commit time (32 bytes of ISO)


class WriterTurn:
    """One process's handle on the turn file ``<journal>-writer``."""

    def __init__(self, journal: Path) -> None:
        self.path = Path(f"{journal}-writer")
        self._fd: int | None = None
        self._pid = 0

    def _file(self) -> int:
        # A forked child must not share its parent's open file description: flock
        # belongs to that description, so parent and child would hold the turn as one.
        if self._fd is None or self._pid != os.getpid():
            try:  # whoever may write the journal may take the turn: its mode, via umask
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError as e:
                raise OperationalError(
                    f"cannot open the writers' turn file {self.path}: {e}"
                ) from e
            self._pid = os.getpid()
        return self._fd

    @contextlib.contextmanager
    def held(self, timeout: float) -> Iterator[None]:
        """Hold the turn (waiting at most ``timeout`` seconds, then WriteLockTimeoutError)."""
        fd = self._file()
        _acquire(fd, timeout)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def hint(self) -> Head | None:
        """The head the last writer committed (only while holding the turn)."""
        data = os.pread(self._file(), _HINT.size, 0)
        if len(data) != _HINT.size:
            return None
        position, chain, stamp = _HINT.unpack(data)
        return Head(position, chain, stamp) if position > 0 else None

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


def _acquire(fd: int, timeout: float) -> None:
    """``flock(LOCK_EX)`` with a timeout: at once if free, else a helper thread blocks
    in the kernel's queue for it (no polling) while the caller waits at most
    ``timeout``; a turn the helper gets after the caller gave up is released at once."""
    with contextlib.suppress(BlockingIOError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    got = threading.Event()
    state = {"abandoned": False}
    guard = threading.Lock()

    def wait() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with guard:
            if state["abandoned"]:
                fcntl.flock(fd, fcntl.LOCK_UN)
                return
            got.set()

    started = time.monotonic()
    threading.Thread(target=wait, daemon=True, name="charter-writer-turn").start()
    if got.wait(timeout):
        return
    with guard:
        if got.is_set():
            return
        state["abandoned"] = True
    raise WriteLockTimeoutError(
        f"another writer has held the journal's write turn for {time.monotonic() - started:.0f} s "
        "(the lock timeout); it may be stalled"
    )
