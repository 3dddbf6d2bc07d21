"""One mechanism for in-process read state: a fold kept current from the journal."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import ClassVar

from charter.core.clock import entry_ms
from charter.core.events import Event
from charter.ledger._app import decode_state
from charter.ledger._rows import stamp_of
from charter.ledger.journal import Committed, Journal

__all__ = ["Folds", "JournalFold", "cyclic_gc_paused"]


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """For building many objects at once (a long fold, a snapshot's load): they make
    no reference cycles, but the cyclic collector keeps re-scanning them as they pile
    up and frees nothing (a snapshot's load is 2-2.5x faster without it); reference
    counting still frees everything as usual. Another thread's pause may end first:
    then the collector runs again, which is only slower."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class JournalFold:
    """A fold over some event types, as of ``position``.

    :meth:`refresh` reads only what was committed since; :meth:`applied` folds the
    caller's own commit without reading it back when nothing else was written in
    between (otherwise the next refresh reads it, in order). Used with pinned appends:
    a decision taken on a stale fold fails to commit.
    """

    types: ClassVar[tuple[str, ...]] = ()
    _wanted: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._wanted = frozenset(cls.types)  # a class's, never an instance's (snapshots)

    def __init__(self) -> None:
        self.position = 0
        # The commit time of the last entry folded (or read past): every entry not
        # folded yet commits at or after it, since commit times never decrease with
        # position. What was decided up to it is final (LeaseBook.remaining).
        self.settled_ms = 0

    def apply(self, event: Event, position: int, at_ms: int) -> None:
        raise NotImplementedError

    def refresh(self, journal: Journal) -> None:
        """Fold what was committed after ``position``: one read of the three columns a
        read model needs, decoding only the entries of ``types``."""
        for position, settled in _read(journal, self.position + 1, self.types, self.apply):
            self.position = position
            self.settled_ms = max(self.settled_ms, settled)

    def applied(self, committed: Sequence[Committed]) -> None:
        """Fold the caller's own commit, giving :meth:`apply` only the entries of
        ``types``, as :meth:`refresh` does."""
        if committed and committed[0].position == self.position + 1:
            at_ms = entry_ms(committed[0].recorded_at)  # one commit, one time
            wanted = self._wanted
            for c in committed:
                if c.event.type_name in wanted:
                    self.apply(c.event, c.position, at_ms)
            self.position = committed[-1].position
            self.settled_ms = max(self.settled_ms, at_ms)


def _read(
    journal: Journal,
    start: int,
    types: Iterable[str],
    apply: Callable[[Event, int, int], None],
) -> Iterator[tuple[int, int]]:
    """Read the journal from ``start`` in batches, giving ``apply`` each entry of
    ``types`` (the three columns a read model needs; only those entries are decoded);
    after each batch, yield its last position and that entry's commit time."""
    wanted = frozenset(types)
    for batch in journal.payloads(start=start):
        for position, topic, state in batch:
            if topic.partition("/")[0] in wanted:
                at, event = decode_state(topic, state)
                apply(event, position, entry_ms(at))
        yield batch[-1][0], _stamp_ms(batch[-1][2])


def _stamp_ms(state: bytes) -> int:
    """An entry's commit time from its stored state, without decoding the rest."""
    return entry_ms(datetime.fromisoformat(stamp_of(state).decode()))


class Folds(JournalFold):
    """Several folds kept current by one read of the journal: each entry is read and
    decoded once, then given to every fold that wants its type and has not folded it
    (a fold added late catches up from its own position)."""

    def __init__(self, *folds: JournalFold) -> None:
        super().__init__()
        self._folds: list[tuple[JournalFold, frozenset[str]]] = []
        for fold in folds:
            self.add(fold)

    def add(self, fold: JournalFold) -> None:
        self._folds.append((fold, frozenset(fold.types)))
        self.position = min(f.position for f, _ in self._folds)

    def apply(self, event: Event, position: int, at_ms: int) -> None:
        name = type(event).type_name
        for fold, wanted in self._folds:
            if position > fold.position and name in wanted:
                fold.apply(event, position, at_ms)

    def refresh(self, journal: Journal) -> None:
        self.position = min(f.position for f, _ in self._folds)
        wanted = frozenset().union(*(w for _, w in self._folds))
        with cyclic_gc_paused():
            for position, settled in _read(journal, self.position + 1, wanted, self.apply):
                self.position = position
                self.settled_ms = max(self.settled_ms, settled)
                for fold, _ in self._folds:
                    fold.position = max(fold.position, self.position)
                    fold.settled_ms = max(fold.settled_ms, self.settled_ms)

    def applied(self, committed: Sequence[Committed]) -> None:
        for fold, _ in self._folds:
            fold.applied(committed)
        self.position = min(f.position for f, _ in self._folds)
        self.settled_ms = min(f.settled_ms for f, _ in self._folds)
