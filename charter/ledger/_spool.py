"""Group commit for SQLite writers (docs/decisions/0007): a writer that finds the
writers' turn taken leaves its batch here, and whoever holds the turn next commits every
waiting batch in one transaction, one fsync for all of them.

A directory ``<journal>-spool`` beside the journal, with two named pipes per writer
process, made at its first wait and kept for its life (no file is made per batch: on
ext4 the inode churn of a file per batch cost more CPU than the commit it saved):

- ``<writer>.in``: the writer's waiting batch, one write of at most ``PIPE_BUF`` bytes
  (so it is read whole, by one reader). A leader *claims* it by reading it; the writer
  *withdraws* it by reading it back. The kernel gives the bytes to exactly one of them,
  so a batch is taken by one leader or by nobody.
- ``<writer>.out``: the leader's answer, written **after** its commit (the ticket,
  positions, hashes and commit time, or the error that refused the batch), or a zero
  byte: "the turn is free, take it". The writer sleeps in ``select`` on it: no thread,
  no lock hand-off, one wake-up.

The writer holds both pipes open (read and write), so opening them never waits and
nothing written to them is lost while it lives. An answer is only a claim: the writer
checks that its entries are in the journal where the answer says before it believes it
(anyone who may write the spool could write into the pipe). A leader that dies after
claiming sends no answer; the writer notices when the turn comes free, and then looks
for its batch in the journal itself.

The bytes are a fixed layout, parsed strictly; they never hold code (a pickle would let
anyone who can write the spool run code in every writer).
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from eventsourcing.persistence import StoredEvent

from charter.ledger._rows import Guards

__all__ = ["MAX_REQUEST", "Answer", "Claimed", "Request", "Spool"]

_REQUEST = b"CHARTER-SPOOL-REQ-3\n"
_ANSWER = b"CHARTER-SPOOL-RES-2\n"
# ticket, deadline ms, expected head, not-before ms (each -1: none), guards, events
_COUNTS = struct.Struct(">16sqqqII")
_GUARD = struct.Struct(">16sq")  # originator, version
_EVENT = struct.Struct(">16sqII")  # originator, version, topic length, state length
_ANSWER_HEAD = struct.Struct(">I16sI32sII")  # length, ticket, entries, stamp, kind, message
_ENTRY = struct.Struct(">q32s")  # position, hash

MAX_REQUEST = select.PIPE_BUF  # larger batches commit themselves (a write of this size is whole)
_NUDGE = b"\0"
_MAX_MESSAGE = 1024


class SpoolFormatError(ValueError):
    """Bytes that are not what this module writes (they are skipped)."""


@dataclass(frozen=True)
class Request:
    """A batch waiting for a leader: what ``insert_events`` was given."""

    ticket: bytes  # 16 bytes, echoed in the answer
    events: tuple[StoredEvent, ...]
    guards: Guards
    deadline_ms: int | None
    expect_head: int | None = None  # the head pin (Journal.append's expect_head)
    not_before_ms: int | None = None

    def encode(self) -> bytes:
        deadline, head, not_before = (
            -1 if x is None else x for x in (self.deadline_ms, self.expect_head, self.not_before_ms)
        )
        counts = _COUNTS.pack(
            self.ticket, deadline, head, not_before, len(self.guards), len(self.events)
        )
        parts = [_REQUEST, counts]
        parts += [_GUARD.pack(originator.bytes, version) for originator, version in self.guards]
        for s in self.events:
            oid = s.originator_id if isinstance(s.originator_id, UUID) else UUID(s.originator_id)
            topic = s.topic.encode()
            parts += [_EVENT.pack(oid.bytes, s.originator_version, len(topic), len(s.state))]
            parts += [topic, s.state]
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> Request:
        reader = _Reader(data, _REQUEST)
        ticket, deadline, head, not_before, n_guards, n_events = reader.unpack(_COUNTS)
        guards = tuple(
            (UUID(bytes=oid), version)
            for oid, version in (reader.unpack(_GUARD) for _ in range(n_guards))
        )
        events = []
        for _ in range(n_events):
            oid, version, topic_len, state_len = reader.unpack(_EVENT)
            topic = reader.take(topic_len).decode()
            events.append(StoredEvent(UUID(bytes=oid), version, topic, reader.take(state_len)))
        if reader.left():
            raise SpoolFormatError("trailing bytes after a request")
        return cls(
            ticket,
            tuple(events),
            guards,
            None if deadline < 0 else deadline,
            None if head < 0 else head,
            None if not_before < 0 else not_before,
        )


@dataclass(frozen=True)
class Answer:
    """What the leader did with a batch: where it committed, or why it was refused."""

    ticket: bytes
    positions: tuple[int, ...]
    hashes: tuple[bytes, ...]
    stamp: bytes
    error: tuple[str, str] | None  # (kind, message) if the batch was refused

    def encode(self) -> bytes:
        kind, message = (b"", b"") if self.error is None else (
            self.error[0].encode()[:64], self.error[1].encode()[:_MAX_MESSAGE]
        )  # fmt: skip
        entries = b"".join(
            _ENTRY.pack(p, h) for p, h in zip(self.positions, self.hashes, strict=True)
        )
        length = _ANSWER_HEAD.size + len(kind) + len(message) + len(entries)
        head = _ANSWER_HEAD.pack(
            length, self.ticket, len(self.positions), self.stamp, len(kind), len(message)
        )
        return b"".join([_ANSWER, head, kind, message, entries])

    @classmethod
    def read(cls, reader: _Reader) -> Answer:
        length, ticket, n, stamp, kind_len, message_len = reader.unpack(_ANSWER_HEAD)
        if length != _ANSWER_HEAD.size + kind_len + message_len + n * _ENTRY.size:
            raise SpoolFormatError("an answer whose length does not add up")
        kind = reader.take(kind_len).decode(errors="replace")
        message = reader.take(message_len).decode(errors="replace")
        entries = [reader.unpack(_ENTRY) for _ in range(n)]
        return cls(
            ticket,
            tuple(p for p, _ in entries),
            tuple(h for _, h in entries),
            stamp,
            (kind, message) if kind else None,
        )


class _Reader:
    def __init__(self, data: bytes, magic: bytes) -> None:
        if not data.startswith(magic):
            raise SpoolFormatError("not spool bytes of this version")
        self._data, self._at = memoryview(data), len(magic)

    def take(self, n: int) -> bytes:
        if n < 0 or self._at + n > len(self._data):
            raise SpoolFormatError("truncated spool bytes")
        chunk = bytes(self._data[self._at : self._at + n])
        self._at += n
        return chunk

    def unpack(self, shape: struct.Struct) -> tuple[Any, ...]:
        return shape.unpack(self.take(shape.size))

    def left(self) -> int:
        return len(self._data) - self._at


class Spool:
    """One process's handle on ``<journal>-spool`` (made by the first writer that
    waits; mode 777 less the umask, like the journal: whoever may write it may use it).
    A forked child makes its own pipes and its own cache of the others'. The directory
    and the pipes get the turn file's permissions (whoever may write the journal), never
    more: a batch put in the spool is committed by whichever writer leads."""

    def __init__(self, journal: Path) -> None:
        self.path = Path(f"{journal}-spool")
        self._journal = journal  # its permissions are the spool's: who may write the journal
        self._waiting = threading.Lock()  # one batch of this process waits at a time
        self._leading = threading.Lock()  # one thread of this process reads the others'
        self._pid = 0
        self._name = ""
        self._in = self._out = -1
        self._received = b""
        self._readers: dict[str, int] = {}  # other writers' .in pipes, held open
        self._readers_pid = 0

    # -- the waiting writer's side ---------------------------------------------------

    def offer(
        self,
        events: tuple[StoredEvent, ...],
        guards: Guards,
        deadline: int | None,
        pins: tuple[int | None, int | None] = (None, None),
    ) -> bytes:
        """Leave a batch for the next leader; its ticket. OSError if the spool cannot be
        used; ValueError if the batch is too large to wait here. ``pins``: the batch's
        expected head and not-before time (Journal.append's), checked by the leader."""
        ticket = uuid4().bytes
        data = Request(ticket, events, guards, deadline, *pins).encode()
        if len(data) > MAX_REQUEST:
            raise ValueError("batch too large for the spool")
        if not self._waiting.acquire(blocking=False):
            raise ValueError("another batch of this process is waiting in the spool")
        try:
            self._own_pipes()
            self._drain_in()  # nothing of an earlier batch is left to be claimed by mistake
            _put(self._in, data)
        except BaseException:
            self._waiting.release()
            raise
        return ticket

    def done(self) -> None:
        """The batch offered has its outcome: another may wait."""
        self._waiting.release()

    def wait(self, ticket: bytes, timeout: float) -> Answer | None:
        """The answer for ``ticket`` if it comes within ``timeout`` seconds; None if
        nothing came, or only a nudge (the turn was let go: the caller tries it after
        any wait)."""
        # poll, never select: a process holding many descriptors (a cell with a
        # thousand sandboxes) has pipes past select()'s limit of 1023
        poller = select.poll()
        poller.register(self._out, select.POLLIN)
        if not poller.poll(max(0.0, timeout) * 1000):
            return None
        return self.answer(ticket)

    def answer(self, ticket: bytes) -> Answer | None:
        """The answer for ``ticket``, if it has come (never waits); nudges are dropped."""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._out, 1 << 16):
                self._received += chunk
        while self._received:
            if self._received.startswith(_NUDGE):
                self._received = self._received.lstrip(_NUDGE)
                continue
            try:
                reader = _Reader(self._received, _ANSWER)
                answer = Answer.read(reader)
            except (SpoolFormatError, struct.error):
                if len(self._received) >= MAX_REQUEST * 4:
                    self._received = b""  # not answers: forget them
                break  # else the rest of an answer is still coming
            self._received = self._received[len(self._received) - reader.left() :]
            if answer.ticket == ticket:
                return answer
        return None

    def withdraw(self) -> bool:
        """Take the waiting batch back; False if a leader claimed it first."""
        return bool(self._drain_in())

    def _drain_in(self) -> bytes:
        try:
            return os.read(self._in, 1 << 16)
        except BlockingIOError:
            return b""

    def _own_pipes(self) -> None:
        if self._pid == os.getpid():
            if os.fstat(self._in).st_nlink:
                return
            # Removed by a leader that looked between this writer's mkfifo and open (it
            # took the pipe for a gone writer's): make new ones, or nobody finds them.
            self._close_own()
        mode = stat.S_IMODE(os.stat(self._journal).st_mode) & 0o666
        if not self.path.is_dir():
            with contextlib.suppress(FileExistsError):
                self.path.mkdir(mode=mode | (mode & 0o444) >> 2)  # x wherever r
        name = f"{os.getpid()}-{uuid4().hex[:12]}"
        fds = []
        try:
            for suffix in (".in", ".out"):
                os.mkfifo(self.path / f"{name}{suffix}", mode)
                # Read and write: opening never waits, and the pipe lives as long as
                # this process does (what is written to it is kept for it).
                fds.append(os.open(self.path / f"{name}{suffix}", _PIPE_FLAGS | os.O_RDWR))
        except OSError:
            for fd in fds:
                os.close(fd)
            for suffix in (".in", ".out"):
                with contextlib.suppress(OSError):
                    os.unlink(self.path / f"{name}{suffix}")
            raise
        self._in, self._out = fds
        self._pid, self._name = os.getpid(), name

    # -- the leader's side -----------------------------------------------------------

    def claim(self, limit: int) -> list[Claimed]:
        """Claim waiting batches (at most ``limit``) of writers that are still there;
        bytes this module did not write are dropped. Answer each with :meth:`reply`
        (or let it go with :meth:`Claimed.close`)."""
        with self._leading:
            return self._claim(limit)

    def _claim(self, limit: int) -> list[Claimed]:
        self._track_writers()
        by_fd = {fd: name for name, fd in self._readers.items()}
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        claimed: list[Claimed] = []
        for fd, _events in poller.poll(0):
            if len(claimed) >= limit:
                break
            name = by_fd[fd]
            # The writer is there if it still reads its answer pipe (it holds it open
            # for its life): a batch whose writer has gone is dropped, never committed
            # late on behalf of nobody (a pipe held open by a leader keeps its bytes).
            try:
                out = os.open(self.path / f"{name}.out", os.O_WRONLY | _PIPE_FLAGS | os.O_NOFOLLOW)
            except OSError:
                self._remove(name)
                continue
            data = _read(fd)
            request = _decode(data) if data else None
            if request is None or not stat.S_ISFIFO(os.fstat(out).st_mode):
                os.close(out)
                if data == b"":  # end of file: nobody holds the pipe open any more
                    self._remove(name)
                continue
            claimed.append(Claimed(name, request, out))
        return claimed

    def reply(self, claimed: Claimed, answer: Answer) -> None:
        """Answer a waiting writer (after the commit); never waits."""
        with contextlib.suppress(OSError):  # a writer never answered finds its batch itself
            os.write(claimed.out, answer.encode())
        claimed.close()

    def nudge(self) -> None:
        """Wake the writer of one waiting batch, if any, to take the turn."""
        if not self._readers and not self.path.is_dir():
            return
        with self._leading:
            self._nudge()

    def _nudge(self) -> None:
        self._track_writers()
        waiting = select.poll()
        for fd in self._readers.values():
            waiting.register(fd, select.POLLIN)
        by_fd = {fd: name for name, fd in self._readers.items()}
        for fd, events in waiting.poll(0):
            if events & select.POLLIN and _send(self.path / f"{by_fd[fd]}.out", _NUDGE):
                return

    def _track_writers(self) -> None:
        """Hold open the ``.in`` pipe of every writer in the spool (new ones as they
        come; those whose pipes are gone are let go)."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            names = []
        writers = {n.removesuffix(".in") for n in names if n.endswith(".in")}
        # This process's own pipe too: a batch in it is another thread's (a leader
        # never leaves its own batch there), and only a holder of the turn may take it.
        if self._readers_pid != os.getpid():  # a forked child: the parent's are not its own
            self._readers, self._readers_pid = {}, os.getpid()
        for gone in self._readers.keys() - writers:
            self._forget(gone)
        for name in writers - self._readers.keys():
            with contextlib.suppress(OSError):
                fd = os.open(self.path / f"{name}.in", _PIPE_FLAGS | os.O_RDONLY | os.O_NOFOLLOW)
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    self._readers[name] = fd
                else:
                    os.close(fd)

    def _remove(self, name: str) -> None:
        """Remove the pipes of a writer that has gone."""
        self._forget(name)
        for suffix in (".in", ".out"):
            with contextlib.suppress(OSError):
                os.unlink(self.path / f"{name}{suffix}")

    def _forget(self, name: str) -> None:
        fd = self._readers.pop(name, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        with self._leading:
            if self._readers_pid == os.getpid():
                for name in list(self._readers):
                    self._forget(name)
            self._readers = {}
        self._close_own()

    def _close_own(self) -> None:
        if self._pid == os.getpid():
            for fd in (self._in, self._out):
                os.close(fd)
            for suffix in (".in", ".out"):
                with contextlib.suppress(OSError):
                    os.unlink(self.path / f"{self._name}{suffix}")
        self._pid = 0


_PIPE_FLAGS = os.O_NONBLOCK | os.O_CLOEXEC


@dataclass
class Claimed:
    """A batch a leader took from a waiting writer, and that writer's answer pipe."""

    name: str
    request: Request
    out: int

    def close(self) -> None:
        if self.out >= 0:
            os.close(self.out)
            self.out = -1


def _read(fd: int) -> bytes | None:
    """What is in a pipe (b"": end of file), or None if nothing is there now."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _decode(data: bytes) -> Request | None:
    try:
        return Request.decode(data)
    except (SpoolFormatError, UnicodeDecodeError, ValueError, struct.error):
        return None  # not a batch: its writer (if any) commits its own


def _put(fd: int, data: bytes) -> None:
    if os.write(fd, data) != len(data):
        raise OSError("short write of a spooled batch")


def _send(fifo: Path, data: bytes) -> bool:
    """Write to a waiting writer's pipe without ever blocking; False if nobody is
    there (a writer that has gone leaves no reader: ENXIO)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | _PIPE_FLAGS | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode) and os.write(fd, data) == len(data)
    except OSError:
        return False  # a writer never answered finds its batch in the journal itself
    finally:
        os.close(fd)
