"""Outward-acting calls: sent at most once per idempotency key (docs/door.md, ``act``).

A call that acts on the world (charges a card, opens a ticket, posts a message) carries
an idempotency key, unique per lease (the caller's lineage). Its life is two journal
entries on the key's own stream, ``outward:<lineage>:<key>``:

1. :class:`OutwardIntent` (the lineage, the key, the sha256 of the request, the
   destination), appended **pinned to the stream being empty**, before anything is sent.
   The pin is checked by the journal under its write lock, so of two tries with one key
   (two threads, two processes, a retry racing its original) exactly one intent commits:
   not a check-then-act, which two writers could both pass. Only the writer whose intent
   committed sends.
2. :class:`OutwardOutcome` (``answered`` with the reply's status and digest,
   ``not-sent`` when the call was refused before a byte of it left, or ``unknown``),
   appended pinned to the stream holding just the intent: one outcome per intent.

A retry with the same key never sends again. It gets the recorded outcome
(``replayed``); if the intent is there without an outcome and its sender is still at
work in this process, it is refused (``outward-pending``); if the sender is gone (its
process died between the intent and the outcome, or the send broke midway), nobody can
know whether the destination acted, so the outcome is recorded as ``unknown`` and
reported so, never re-sent. A restarted cell records ``unknown`` for every intent of the
workers it fails (:meth:`OutwardCalls.recover`). A key used again for another request
(another digest) is refused (``outward-key-reused``) and nothing is sent.

Each entry's batch id is derived from the key's stream, so the intent and the outcome of
a key are found with one indexed read each (:meth:`Journal.batch_entries`), however long
the journal; the intent carries a random ``attempt``, so two tries never look like one
append retried.
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from charter.control.errors import OutwardKeyReusedError, OutwardPendingError
from charter.core import BadInputError, Event
from charter.ledger import (
    AppendConflictError,
    BatchCommittedError,
    Committed,
    Journal,
)

__all__ = [
    "OUTWARD_KEY_PATTERN",
    "DESTINATION_CAP",
    "OutwardAnswer",
    "OutwardCalls",
    "OutwardIntent",
    "OutwardKeyReusedError",
    "OutwardNotSent",
    "OutwardOutcome",
    "OutwardPendingError",
    "OutwardReply",
    "check_key",
    "outward_stream",
]

OUTWARD_KEY_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
"""An idempotency key: 1 to 64 letters, digits, ``.``, ``_`` or ``-``."""
DESTINATION_CAP = 255
DETAIL_CAP = 512


def outward_stream(lineage: str, key: str) -> str:
    """The stream of one key of one lease: its intent, then its one outcome."""
    return f"outward:{lineage}:{key}"


def _batch(kind: str, stream: str) -> str:
    """The batch id of a key's intent (``kind`` ``i``) or outcome (``o``)."""
    return f"out{kind}" + hashlib.sha256(stream.encode()).hexdigest()[:56]


class OutwardIntent(Event):
    """An outward-acting call is about to be sent: journaled before a byte of it leaves,
    pinned to its key's stream being empty (one intent per key and lease)."""

    type_name = "OutwardIntent"
    lineage: str
    key: str = Field(pattern=OUTWARD_KEY_PATTERN)
    attempt: str = Field(pattern=r"^[0-9a-f]{32}$")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    """sha256 of the request as sent (method, target, headers, body)."""
    destination: str = Field(max_length=DESTINATION_CAP)
    """``host:port`` the request goes to."""

    def stream(self) -> str:
        return outward_stream(self.lineage, self.key)


class OutwardOutcome(Event):
    """What became of the call of an intent (at most one per intent):

    * ``answered``: the destination answered; ``http_status`` and the reply's digest;
    * ``not-sent``: refused before a byte of it left (not in the grant, unreachable);
    * ``unknown``: it may have reached the destination (the send broke midway, or its
      sender died between the intent and this record); never re-sent."""

    type_name = "OutwardOutcome"
    lineage: str
    key: str = Field(pattern=OUTWARD_KEY_PATTERN)
    status: Literal["answered", "not-sent", "unknown"]
    http_status: int = Field(default=0, ge=0, le=999)
    reply_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    reply_bytes: int = Field(default=0, ge=0)
    detail: str = Field(default="", max_length=DETAIL_CAP)

    def stream(self) -> str:
        return outward_stream(self.lineage, self.key)


@dataclass(frozen=True)
class OutwardReply:
    """What the destination answered: its status and the reply's bytes."""

    status: int
    body: bytes


class OutwardNotSent(Exception):  # noqa: N818 (an outcome, not a fault)
    """Raised by a sender when the call was refused before any byte of it was sent."""


@dataclass(frozen=True)
class OutwardAnswer:
    """The outcome a caller gets: fresh (``replayed`` false: this call sent it, and
    ``body`` is the reply) or the one recorded for the key before (``body`` None)."""

    outcome: OutwardOutcome
    replayed: bool
    body: bytes | None = None

    def to_json(self) -> dict[str, object]:
        o = self.outcome
        return {
            "key": o.key,
            "status": o.status,
            "http_status": o.http_status,
            "reply_digest": o.reply_digest,
            "reply_bytes": o.reply_bytes,
            "detail": o.detail,
            "replayed": self.replayed,
        }


Applied = Callable[[tuple[Committed, ...]], object]


class OutwardCalls:
    """Outward calls against one journal: ``act`` sends a keyed call at most once;
    ``recover`` records ``unknown`` for the calls a dead process left without an outcome.

    ``applied`` is told of every commit (a cell folds them into its views); ``lock`` is
    held around each append (a cell's ``changed`` condition)."""

    def __init__(
        self,
        journal: Journal,
        *,
        applied: Applied = lambda _c: None,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.journal = journal
        self._applied = applied
        self._lock: AbstractContextManager[Any] = lock or threading.RLock()
        self._inflight: set[str] = set()  # streams this process is sending now
        self._guard = threading.Lock()

    def act(
        self,
        lineage: str,
        key: str,
        digest: str,
        destination: str,
        send: Callable[[], OutwardReply],
    ) -> OutwardAnswer:
        """Send the call ``send`` makes at most once for ``(lineage, key)``: journal its
        intent (pinned), call ``send``, journal its outcome. A key already used answers
        its recorded outcome and sends nothing (see the module docstring)."""
        intent = OutwardIntent(
            lineage=lineage, key=key, attempt=uuid.uuid4().hex, digest=digest,
            destination=destination[:DESTINATION_CAP],
        )  # fmt: skip
        stream = intent.stream()
        with self._guard:  # marked before the append: a retry now sees it pending
            if stream in self._inflight:
                raise OutwardPendingError(_pending(key))
            self._inflight.add(stream)
        try:
            try:
                self._append([intent], stream, 0, _batch("i", stream))
            except (AppendConflictError, BatchCommittedError):
                with self._guard:
                    self._inflight.discard(stream)
                return self._earlier(lineage, key, digest)
            outcome, body = self._send(intent, send)
            recorded = self._record(outcome)
            return OutwardAnswer(recorded, replayed=recorded != outcome, body=body)
        finally:
            with self._guard:
                self._inflight.discard(stream)

    def _send(
        self, intent: OutwardIntent, send: Callable[[], OutwardReply]
    ) -> tuple[OutwardOutcome, bytes | None]:
        lineage, key = intent.lineage, intent.key
        try:
            reply = send()
        except OutwardNotSent as e:
            refused = OutwardOutcome(
                lineage=lineage, key=key, status="not-sent", detail=str(e)[:DETAIL_CAP]
            )
            return refused, None
        except Exception as e:  # noqa: BLE001 - whatever broke, it may have been sent
            detail = f"the send broke midway ({type(e).__name__}); it may have reached it"
            lost = OutwardOutcome(lineage=lineage, key=key, status="unknown", detail=detail)
            return lost, None
        outcome = OutwardOutcome(
            lineage=lineage, key=key, status="answered", http_status=reply.status,
            reply_digest=hashlib.sha256(reply.body).hexdigest(), reply_bytes=len(reply.body),
        )  # fmt: skip
        return outcome, reply.body

    def _record(self, outcome: OutwardOutcome) -> OutwardOutcome:
        """Journal ``outcome`` pinned to its stream holding the intent alone; the one
        recorded already if another writer recorded first."""
        stream = outcome.stream()
        try:
            self._append([outcome], stream, 1, _batch("o", stream))
        except (AppendConflictError, BatchCommittedError):
            found = self.recorded(outcome.lineage, outcome.key)
            if found is None or found[1] is None:
                raise
            return found[1]
        return outcome

    def _append(self, events: list[Event], stream: str, version: int, batch: str) -> None:
        with self._lock:
            committed = self.journal.append(events, expect={stream: version}, batch=batch)
            self._applied(committed)

    def _earlier(self, lineage: str, key: str, digest: str) -> OutwardAnswer:
        """A try whose key was used before: its recorded outcome, or ``unknown``
        recorded now when its intent has no outcome and no sender here."""
        found = self.recorded(lineage, key)
        if found is None:  # the pin refused it, so an intent is there: read it again
            raise AppendConflictError(f"outward key {key!r}: its intent could not be read")
        intent, outcome = found
        if intent.digest != digest:
            raise OutwardKeyReusedError(
                f"idempotency key {key!r} of {lineage} was used for another request "
                f"(sha256 {intent.digest[:16]}…); nothing was sent: use a new key for a "
                "new request"
            )
        if outcome is None:
            with self._guard:
                if intent.stream() in self._inflight:
                    raise OutwardPendingError(_pending(key))
            lost = OutwardOutcome(
                lineage=lineage, key=key, status="unknown",
                detail="its sender ended between the intent and the outcome; not re-sent",
            )  # fmt: skip
            outcome = self._record(lost)
        return OutwardAnswer(outcome, replayed=True)

    def recorded(
        self, lineage: str, key: str
    ) -> tuple[OutwardIntent, OutwardOutcome | None] | None:
        """The intent and the outcome journaled for ``(lineage, key)``, if any."""
        stream = outward_stream(lineage, key)
        intents = [
            e.event
            for e in self.journal.batch_entries(_batch("i", stream))
            if isinstance(e.event, OutwardIntent)
        ]
        if not intents:
            return None
        outcomes = [
            e.event
            for e in self.journal.batch_entries(_batch("o", stream))
            if isinstance(e.event, OutwardOutcome)
        ]
        return intents[0], (outcomes[0] if outcomes else None)

    def recover(self, lineage: str) -> int:
        """Record ``unknown`` for each intent of ``lineage`` without an outcome (its
        process died in between): call when failing a worker a dead incarnation left.
        Returns how many were recorded."""
        open_: dict[str, OutwardIntent] = {}
        for entry in self.journal.entries(types=("OutwardIntent", "OutwardOutcome")):
            event = entry.event
            if isinstance(event, OutwardIntent) and event.lineage == lineage:
                open_[event.key] = event
            elif isinstance(event, OutwardOutcome) and event.lineage == lineage:
                open_.pop(event.key, None)
        done = 0
        for key in open_:
            lost = OutwardOutcome(
                lineage=lineage, key=key, status="unknown",
                detail="its cell died between the intent and the outcome; not re-sent",
            )  # fmt: skip
            done += self._record(lost) == lost
        return done


def _pending(key: str) -> str:
    return (
        f"the call with idempotency key {key!r} is still being sent; ask again with the "
        "same key for its outcome (it is never sent twice)"
    )


def check_key(key: str) -> str:
    """An idempotency key as :data:`OUTWARD_KEY_PATTERN` says, else BadInputError."""
    if not re.fullmatch(OUTWARD_KEY_PATTERN, key):
        raise BadInputError(
            f"idempotency key {key[:80]!r}: 1 to 64 letters, digits, '.', '_' or '-'"
        )
    return key
