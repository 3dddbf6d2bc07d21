"""The one "decide, append pinned, retry on conflict" loop every command handler uses.

A handler reads the versions of the streams its decision depends on, then the views
(so the views cover everything those versions do), decides, and appends pinned to
those versions: one refresh per attempt. Which streams it reads may depend on the
views (a fan-out reads every cell they know): named as the views stand before the
refresh, and a decision that finds, on the views just refreshed, a stream it should
have read raises :class:`StreamsGrewError` to be decided again with that stream read.
If another writer moved one of them meanwhile, the journal refuses the append (nothing
is written) and the decision is made again on the state now, at most :data:`RETRIES`
times; after that the caller is told to retry. The views' lock is held
from the read to the commit, so the process's own handlers never race each other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from charter.core import Event
from charter.ledger import AppendConflictError, Committed, Journal

__all__ = ["RETRIES", "Folded", "Pinned", "StreamsGrewError", "append_pinned"]

RETRIES = 16
"""How many times a decision is made again because a stream it read moved before its
append committed. Each retry happens only after another writer committed to one of the
decision's streams, so the bound is reached only under sustained contention."""


class StreamsGrewError(Exception):
    """Raised by a decision of :func:`append_pinned` whose views, just refreshed, name a
    stream it depends on that was not read before them (a cell configured since): never
    seen by a caller, it is decided again with every stream the views name read first
    (one of the :data:`RETRIES`)."""


@dataclass(frozen=True)
class Pinned:
    """A decision to append: its events, the stream versions it was decided on (the
    append is pinned to exactly these), the earliest instant it stops being true (the
    journal refuses a commit at or after it), if any, its batch id, if it has one, a
    follower's tracking position, committed with the effect it records, and, for a
    decision that took recent expiries as final, the journal's head as it read it and
    the commit time it needs (``Journal.append``'s ``expect_head``, ``not_before_ms``;
    ``resources.Settling``)."""

    events: Sequence[Event]
    expect: Mapping[str, int] = field(default_factory=dict)
    deadline_ms: int | None = None
    batch: str | None = None
    tracking: tuple[str, int] | None = None  # a follower's position, committed with it
    expect_head: int | None = None
    not_before_ms: int | None = None


class Folded(Protocol):
    """Views a handler decides on (``charter.control.Views``): one lock, one refresh
    that brings them all up to date, and the process's own commits folded in."""

    lock: threading.RLock

    def refresh(self, journal: Journal) -> None: ...

    def applied(self, committed: Sequence[Committed]) -> None: ...


def append_pinned(
    journal: Journal,
    shared: Folded,
    streams: Iterable[str] | Callable[[], Iterable[str]],
    decide: Callable[[dict[str, int]], Pinned | None],
    *,
    what: str,
    retry_on: tuple[type[Exception], ...] = (AppendConflictError,),
) -> tuple[Pinned, tuple[Committed, ...]] | None:
    """Read the versions of ``streams`` (or of those ``streams()`` names on the views
    as they stand, each attempt), then refresh the views, then decide, then append
    pinned to the versions the decision names (its ``expect``); None when it has
    nothing to append. ``decide`` may raise (a refusal: nothing is appended), or
    :class:`StreamsGrewError` to be decided again with the streams named anew. A
    commit refused with one of ``retry_on`` (a pinned stream moved, or the pinned head:
    HeadPinLostError is an AppendConflictError; for a fan-out, also a deadline that
    passed) is decided again."""
    fixed = None if callable(streams) else list(streams)
    for _ in range(RETRIES):
        with shared.lock:
            names = fixed if fixed is not None else list(streams())  # type: ignore[operator]
            versions = journal.stream_versions(names)  # one read for the chain
            shared.refresh(journal)  # after the versions: the views cover all they do
            try:
                decision = decide(versions)
            except StreamsGrewError:
                continue  # the views name a stream more: read it, then decide again
            if decision is None or not decision.events:
                return None
            try:
                committed = journal.append(
                    decision.events,
                    expect=decision.expect,
                    deadline_ms=decision.deadline_ms,
                    batch=decision.batch,
                    tracking=decision.tracking,
                    expect_head=decision.expect_head,
                    not_before_ms=decision.not_before_ms,
                )
            except retry_on:
                continue
            shared.applied(committed)
            return decision, committed
    raise AppendConflictError(f"{what} kept racing other writers ({RETRIES} tries); retry")
