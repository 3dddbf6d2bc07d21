"""Group commit through the writers' turn and spool, for both backends (decisions 0007
and 0008): a writer that finds the turn taken leaves its batch in the spool and sleeps
on its pipe; whoever holds the turn commits every waiting batch in one transaction and
answers each writer after the commit. The orchestration is here, once; a recorder
supplies where its turn and spool live, how a group is committed, and how a batch is
read back (:class:`SharedCommit`'s abstract methods)."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple
from uuid import UUID

from eventsourcing.persistence import (
    IntegrityError,
    PersistenceError,
    ProgrammingError,
    StoredEvent,
)

from charter.core.errors import BadInputError
from charter.ledger._rows import (
    CommitOutcomeAmbiguousError,
    CommitPastDeadlineError,
    Guards,
    Head,
    HeadMovedError,
    LastCommit,
    PinnedStreamMovedError,
    WriteLockTimeoutError,
    payload_bytes,
    set_last_commit,
    stamp_of,
)
from charter.ledger._spool import Answer, Claimed, Request, Spool
from charter.ledger._turn import ProcessLock, WriterTurn

__all__ = [
    "GROUP_COMMIT",
    "Batch",
    "SharedCommit",
    "SpoolClosingFactory",
    "group_commit_on",
    "private_place",
]

# The setting that switches group commit off (issue 20 point 7): the environment
# variable CHARTER_GROUP_COMMIT, or the key GROUP_COMMIT in Journal.open(env=…).
GROUP_COMMIT = "GROUP_COMMIT"
_ON = frozenset({"on", "1", "yes", "true"})
_OFF = frozenset({"off", "0", "no", "false"})


def group_commit_on(value: str | None) -> bool:
    """Whether writers share commits (the default). A value that is neither on nor off
    is refused, never guessed: a typo must not silently keep a setting the operator
    meant to change."""
    word = (value or "on").strip().lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise BadInputError(
        f"CHARTER_{GROUP_COMMIT}={value!r} is neither on nor off; write "
        f"CHARTER_{GROUP_COMMIT}=off to commit every batch alone"
    )


_making = ProcessLock()  # held while a recorder makes its turn and spool

_GROUP_LIMIT = 256  # waiting batches one leader commits in one transaction
_NAP_S = 0.05  # a waiting writer looks whether the turn is free this often (a leader died)

# A batch's pin of the journal's head (Journal.append's expect_head, not_before_ms):
# carried through the spool, checked by whichever writer leads, under the write lock.
_PINS = ("expect_head", "not_before_ms")

_REFUSALS: dict[str, type[PersistenceError]] = {
    "PinnedStreamMovedError": PinnedStreamMovedError,
    "CommitPastDeadlineError": CommitPastDeadlineError,
    "HeadMovedError": HeadMovedError,
    "IntegrityError": IntegrityError,
    "ProgrammingError": ProgrammingError,
}


class Batch(NamedTuple):
    """One ``insert_events`` call: its events and keyword arguments."""

    events: tuple[StoredEvent, ...]
    kwargs: dict[str, Any]

    def may_wait_in_spool(self) -> bool:
        """A follower's batch (its tracking position) commits itself."""
        kwargs = self.kwargs
        return (
            kwargs.get("tracking") is None
            and set(kwargs) <= {"guards", "deadline_ms", "tracking", *_PINS}
            and len(self.events) > 0
        )

    def guards(self) -> Guards:
        return tuple(self.kwargs.get("guards") or ())

    def pins(self) -> tuple[int | None, int | None]:
        """The head pin: (``expect_head``, ``not_before_ms``), each None if not set."""
        return self.kwargs.get("expect_head"), self.kwargs.get("not_before_ms")

    @classmethod
    def waiting(cls, request: Request) -> Batch:
        return cls(
            request.events,
            {
                "guards": request.guards,
                "deadline_ms": request.deadline_ms,
                "expect_head": request.expect_head,
                "not_before_ms": request.not_before_ms,
            },
        )

    def keys(self) -> list[tuple[UUID, int]]:
        return [(as_uuid(s.originator_id), s.originator_version) for s in self.events]


def as_uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


def answer_for(ticket: bytes, outcome: LastCommit | Exception) -> Answer:
    if isinstance(outcome, Exception):
        kind = type(outcome).__name__
        error = (kind if kind in _REFUSALS else "IntegrityError", str(outcome))
        return Answer(ticket, (), (), bytes(32), error)
    return Answer(ticket, outcome.positions, outcome.hashes, outcome.stamp, None)


class SharedCommit:
    """The writers' side of group commit. A recorder mixes it in and implements
    :meth:`_spool_place`, :meth:`_commit_group`, :meth:`_entries_between` and
    :meth:`_entries_of`."""

    _turn: WriterTurn | None = None
    _spool: Spool | None = None
    _spool_used = False  # once a writer has waited in the spool, a leader always looks
    # False (CHARTER_GROUP_COMMIT=off): every batch commits alone, in its own
    # transaction, with no turn, no spool and no head hint (set by the factory).
    group_commit = True

    # -- what a backend supplies ---------------------------------------------------------

    def _spool_place(self) -> Path:
        """The path the turn file (``<path>-writer``) and spool (``<path>-spool``) are
        named after, and whose permissions the spool takes."""
        raise NotImplementedError

    def _lock_timeout_s(self) -> float:
        raise NotImplementedError

    def _commit_group(
        self, own: Batch, waiting: list[Claimed], hint: Head | None
    ) -> LastCommit | Exception:
        """One transaction: ``own`` (whose failure is raised, or returned if others
        share the transaction) and the waiting batches, each refused alone; the waiting
        writers are answered (:meth:`_reply`) after the commit."""
        raise NotImplementedError

    def _entries_between(self, first: int, last: int) -> list[tuple[int, UUID, int, bytes]]:
        """(position, stream, version, chain hash) of the entries from first to last."""
        raise NotImplementedError

    def _entries_of(
        self, keys: Sequence[tuple[UUID, int]]
    ) -> list[tuple[int, bytes, bytes] | None]:
        """(position, chain hash, state) of each (stream, version)'s entry, if any, read
        on one connection."""
        raise NotImplementedError

    # -- the orchestration ---------------------------------------------------------------

    def _insert_shared(self, stored_events: Sequence[StoredEvent], kwargs: dict[str, Any]) -> Any:
        """Commit a batch through the writers' turn (``_turn``: a kernel queue, so the
        next writer starts as soon as the last one commits). A writer that finds the
        turn free leads at once; one that finds it taken leaves its batch in the spool
        (``_spool``) and sleeps on its pipe, and the leader commits every waiting batch
        in its one transaction."""
        set_last_commit(None)
        if not self.group_commit:
            return self._insert_alone(Batch(tuple(stored_events), kwargs))
        if self._turn is None or self._spool is None:
            self._make_turn_and_spool()
        assert self._turn is not None
        assert self._spool is not None
        batch = Batch(tuple(stored_events), kwargs)
        if self._turn.try_take():
            return self._lead(batch)
        deadline = time.monotonic() + self._lock_timeout_s()
        ticket = self._offer(batch)
        if ticket is None:
            self._turn.take(deadline)
            return self._lead(batch)
        try:
            if self._turn.try_take():  # the leader left before the batch was there
                return self._lead_after_waiting(ticket, batch)
            return self._await(ticket, batch, deadline)
        finally:
            self._spool.done()

    def _make_turn_and_spool(self) -> None:
        """The recorder's one turn and spool, made by the first thread that writes.
        Threads that each made their own held the turn through different open files
        (which exclude each other) and released one through the other's: the turn
        stayed taken and every later writer waited the whole lock timeout."""
        with _making:
            if self._turn is None or self._spool is None:
                place = self._spool_place()
                self._turn, self._spool = WriterTurn(place), Spool(place)

    def _insert_alone(self, batch: Batch) -> list[int]:
        """Group commit switched off: the batch in a transaction of its own, waiting
        for the database's write lock like any writer (no turn, spool or hint)."""
        set_last_commit(None)
        outcome = self._commit_group(batch, [], None)
        if isinstance(outcome, Exception):
            raise outcome
        set_last_commit(outcome)
        return list(outcome.positions)

    def close_spool(self) -> None:
        """Let go of the spool and the turn file (an open descriptor per journal a
        process ever opened, until a long test run ran out of descriptors)."""
        if self._spool is not None:
            self._spool.close()
        if self._turn is not None:
            self._turn.close()

    def _offer(self, batch: Batch) -> bytes | None:
        """Leave the batch in the spool; its ticket, or None if it must be committed by
        this writer (a follower's tracking position, a batch too large for the spool,
        or a spool it cannot use)."""
        assert self._spool is not None
        if not batch.may_wait_in_spool():
            return None
        try:
            if not self._spool_used:
                assert self._turn is not None
                self._turn.mark_spool_used()  # before the batch is there: see _release
                self._spool_used = True
            return self._spool.offer(
                batch.events, batch.guards(), batch.kwargs.get("deadline_ms"), batch.pins()
            )
        except (OSError, ValueError):
            return None

    def _await(self, ticket: bytes, batch: Batch, deadline: float) -> list[int]:
        """Sleep on the ticket's pipe until a leader answers; when woken without an
        answer (nudged by a writer that let the turn go) or after a nap, try the turn:
        if it is free, no leader has the batch, and this writer leads."""
        assert self._turn is not None
        while True:
            assert self._spool is not None
            nap = min(_NAP_S, max(0.0, deadline - time.monotonic()))
            done = self._believe(self._spool.wait(ticket, nap), batch)
            if done is not None:
                return done
            if self._turn.try_take():
                return self._lead_after_waiting(ticket, batch)
            if time.monotonic() >= deadline:
                if self._spool.withdraw():  # no leader took it: nothing was written
                    raise WriteLockTimeoutError(
                        "another writer has held the journal's write turn for the whole "
                        "lock timeout; it may be stalled"
                    )
                done = self._believe(self._spool.answer(ticket), batch)
                if done is not None:
                    return done
                raise CommitOutcomeAmbiguousError(
                    "another writer took this batch into its commit and has not finished "
                    "within the lock timeout (it may be stalled)",
                    backend_pid=0,
                )

    def _lead_after_waiting(self, ticket: bytes, batch: Batch) -> list[int]:
        """Holding the turn after waiting: an answer may have come meanwhile; else the
        batch is taken back, or, if a leader claimed it and then died, looked for in
        the journal (that leader may have committed it before dying)."""
        assert self._turn is not None
        assert self._spool is not None
        try:
            done = self._believe(self._spool.answer(ticket), batch)
            if done is None and not self._spool.withdraw():
                found = self._find_committed(batch)
                if found is not None:
                    set_last_commit(found)
                    done = list(found.positions)
        except BaseException:
            self._turn.release()
            raise
        if done is not None:
            self._release()
            return done
        return self._lead(batch)

    def _believe(self, answer: Answer | None, batch: Batch) -> list[int] | None:
        """The answer's positions if the journal holds this batch there (a refusal is
        raised); None if there is no answer, or one the journal does not bear out."""
        if answer is None:
            return None
        if answer.error is not None:
            kind, message = answer.error
            raise _REFUSALS.get(kind, IntegrityError)(message)
        expected = [
            (p, oid, version, h)
            for p, (oid, version), h in zip(
                answer.positions, batch.keys(), answer.hashes, strict=False
            )
        ]
        if not expected or len(expected) != len(batch.events):
            return None
        if self._entries_between(expected[0][0], expected[-1][0]) != expected:
            return None
        set_last_commit(LastCommit(answer.positions, answer.hashes, answer.stamp))
        return list(answer.positions)

    def _find_committed(self, batch: Batch) -> LastCommit | None:
        """This batch's entries, if a leader committed it (all or none: one transaction)."""
        found = []
        for row, s in zip(self._entries_of(batch.keys()), batch.events, strict=True):
            if row is None or payload_bytes(row[2]) != payload_bytes(s.state):
                return None
            found.append((row[0], row[1], stamp_of(row[2])))
        return LastCommit(tuple(p for p, _, _ in found), tuple(h for _, h, _ in found), found[0][2])

    def _lead(self, batch: Batch) -> list[int]:
        """Holding the turn: commit this batch and every batch waiting in the spool, in
        one transaction, then answer the waiting writers; release the turn."""
        assert self._turn is not None
        waiting: list[Claimed] = []
        try:
            hint, spooled = self._turn.hint()  # written only after a commit: never ahead
            self._spool_used = self._spool_used or spooled
            if self._spool_used:
                waiting = self._claim()
            outcome = self._commit_group(batch, waiting, hint)
        finally:
            for claimed in waiting:
                claimed.close()  # unanswered (the commit failed): they find their way
            self._release()
        if isinstance(outcome, Exception):
            raise outcome
        set_last_commit(outcome)
        return list(outcome.positions)

    def _release(self) -> None:
        """Let the turn go; if a batch is waiting in the spool, wake its writer to take
        the turn and lead (it may be asleep for a whole nap otherwise).

        Every holder does this after letting the turn go, and every writer tries the
        turn once more after leaving its batch, so a waiting batch is always either
        seen by a holder that has let go, or its own writer takes the turn. (A writer
        marks the spool used before its first batch there, so the look after letting
        go sees the mark whenever that writer found the turn taken.)"""
        assert self._turn is not None
        assert self._spool is not None
        self._turn.release()
        self._spool_used = self._spool_used or self._turn.spool_used()
        if self._spool_used:
            self._spool.nudge()

    def _claim(self) -> list[Claimed]:
        assert self._spool is not None
        try:
            return self._spool.claim(_GROUP_LIMIT)
        except OSError:
            return []  # a spool this writer cannot read: those writers commit themselves

    def _reply(self, waiting: list[Claimed], outcomes: Sequence[LastCommit | Exception]) -> None:
        """After the commit: each waiting writer's answer."""
        if not waiting:
            return
        assert self._spool is not None
        for claimed, outcome in zip(waiting, outcomes, strict=True):
            self._spool.reply(claimed, answer_for(claimed.request.ticket, outcome))


class SpoolClosingFactory:
    """A factory mixin: closing the factory lets go of its recorders' places in the
    writers' spool (their pipes)."""

    _recorders: list[SharedCommit]

    def application_recorder(self) -> Any:
        return self._keep(super().application_recorder())  # type: ignore[misc]

    def process_recorder(self) -> Any:
        return self._keep(super().process_recorder())  # type: ignore[misc]

    def _keep(self, recorder: Any) -> Any:
        if isinstance(recorder, SharedCommit):
            # Only CHARTER_GROUP_COMMIT (Journal.open's env sets it too), read as a plain
            # dict: the library's lookup would also take a bare GROUP_COMMIT from the
            # process environment, a name Charter does not own.
            env = getattr(self, "env", None) or {}
            recorder.group_commit = group_commit_on(dict.get(env, f"CHARTER_{GROUP_COMMIT}"))
            if not hasattr(self, "_recorders"):
                self._recorders = []
            self._recorders.append(recorder)
        return recorder

    def close(self) -> None:
        for recorder in getattr(self, "_recorders", ()):
            recorder.close_spool()
        super().close()  # type: ignore[misc]


def private_place(identity: str) -> Path:
    """A place for the turn and spool of a journal with no file of its own (a
    PostgreSQL journal): ``pg-<hash of identity>`` in a directory only this user may
    enter (``$XDG_RUNTIME_DIR/charter`` if that is absolute, else
    ``~/.cache/charter/run``). Raises OSError
    if that directory is not private (never a predictable name in a shared place)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):  # a relative one is ignored, as the XDG spec says
        base = Path(runtime) / "charter"
    else:
        try:
            base = Path.home() / ".cache" / "charter" / "run"
        except (RuntimeError, KeyError) as e:
            raise OSError(f"no home directory for the writers' turn and spool: {e}") from e
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = base.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{base} is not a directory private to this user")
    place = base / f"pg-{hashlib.sha256(identity.encode()).hexdigest()[:32]}"
    fd = os.open(place, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    return place
