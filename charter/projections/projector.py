"""The projector: keeps the projection tables current and answers queries as of any
journal position.

It follows the journal by polling (SQLite has no ``subscribe()``): each step reads the
raw rows after the tracked position, folds them, and writes the rows **and** the new
tracking position in one transaction, so a process killed at any instant leaves either
all of a step or none of it, and a restart resumes exactly after the last commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from charter.core import InternalError, now_ms
from charter.ledger import Journal, cyclic_gc_paused
from charter.projections import _postgres, _sqlite
from charter.projections._answers import (
    BudgetReport,
    SlotsReport,
    TreeNode,
    TreeReport,
    _status,
    burns,
    gone_cells,
    worker_shown,
)
from charter.projections._fold import L_LINEAGE, L_SPENT, Fold, at_ms_of_state
from charter.projections._store import NEWEST_TABLE, ProjectionStore
from charter.projections.errors import PositionBeyondHeadError, ProjectionConflictError

__all__ = ["Projector", "DEFAULT_NAME"]

DEFAULT_NAME = "proj"
_CHUNK = 20_000  # events per incremental transaction when catching up a long backlog


def _store_for(journal: Journal, prefix: str) -> ProjectionStore:
    location = journal.location
    tracking = f"charter.projections.{prefix}"
    if location.kind == "sqlite":
        if location.path is None:  # resolve_location always sets it
            raise InternalError("a SQLite journal location without a path")
        if journal.read_only:  # nothing is written into a journal opened read-only
            return _sqlite.SQLiteProjectionStore.scratch(prefix, tracking)
        return _sqlite.SQLiteProjectionStore(location.path, prefix, tracking)
    return _postgres.PostgresProjectionStore(location.conninfo or {}, prefix, tracking)


class Projector:
    """The budgets, lineage tree and slot projections of one journal.

    ``name`` prefixes the tables (several independent copies can live side by side,
    which is how the tests compare a rebuilt copy with an incremental one).
    """

    def __init__(self, journal: Journal, name: str = DEFAULT_NAME) -> None:
        self.journal = journal
        self.store = _store_for(journal, name)
        self._fold: Fold | None = None  # current rows as of _fold.position, if loaded
        with self.store.write() as cur:
            # A projection made before its newest table existed has no rows of that
            # table for the entries it already folded: replay it once, from zero.
            stale = not self.store.table_exists(cur, NEWEST_TABLE) and self.store.tracked(cur) > 0
            self.store.create(cur)
        if stale:
            self.rebuild()

    @property
    def tracking_name(self) -> str:
        return self.store.tracking_name

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Projector:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------

    def position(self) -> int:
        """The journal position the tables reflect."""
        with self.store.read() as cur:
            return self.store.tracked(cur)

    def catch_up(self, stop: int | None = None, *, chunk: int = _CHUNK) -> int:
        """Project every entry after the tracked position (up to ``stop``); return the
        new position. Each chunk commits with its tracking position."""
        head = self.journal.head()
        target = 0 if head is None else head[0]
        if stop is not None:
            target = min(target, stop)
        while True:
            with self.store.write() as cur:
                tracked = self.store.tracked(cur)
                if tracked >= target:
                    return tracked
                fold = self._fold
                if fold is None or fold.position != tracked:
                    # Another process moved the tables on (or this is the first step):
                    # start again from what is committed.
                    fold = Fold(tracked)
                    fold.load(*self.store.current(cur))
                self._fold = None  # until this transaction commits
                end = min(target, tracked + chunk)
                self._fold_range(cur, fold, tracked + 1, end)
                self._commit(cur, fold, end)
            self._fold = fold

    def _fold_range(self, cur: object, fold: Fold, start: int, stop: int) -> None:
        with cyclic_gc_paused():
            for batch in self.journal.payloads(start, stop):
                fold.apply_rows(batch)
                self.store.apply(cur, fold.take(final=False))

    def _commit(self, cur: object, fold: Fold, end: int) -> None:
        # The end of the range, even where PostgreSQL left a gap in the positions.
        fold.position = end
        self.store.apply(cur, fold.take(final=True))
        if not self.store.set_tracked(cur, end):
            raise ProjectionConflictError(
                f"{self.tracking_name} has already recorded position {end}; refusing to "
                "project it twice"
            )

    def rebuild(self, stop: int | None = None) -> int:
        """Drop every row and project the journal from zero, in one transaction."""
        head = self.journal.head()
        target = 0 if head is None else head[0]
        if stop is not None:
            target = min(target, stop)
        self._fold = None
        with self.store.write() as cur:
            self.store.reset(cur)
            fold = Fold(0)
            if target > 0:
                self._fold_range(cur, fold, 1, target)
                self._commit(cur, fold, target)
            self.store.create_indexes(cur)
        self._fold = fold if target > 0 else None
        return target

    def follow(
        self,
        *,
        poll_s: float = 0.005,
        until: Callable[[], bool] = lambda: False,
        on_step: Callable[[int], None] | None = None,
        chunk: int = _CHUNK,
    ) -> int:
        """Catch up, then keep polling the journal head until ``until()`` is true."""
        position = self.catch_up(chunk=chunk)
        while not until():
            head = self.journal.head()
            if head is not None and head[0] > position:
                position = self.catch_up(chunk=chunk)
                if on_step is not None:
                    on_step(position)
            else:
                time.sleep(poll_s)
        return position

    # -- reading ---------------------------------------------------------------------

    def _as_of(self, cur: object, as_of: int | None) -> int:
        tracked = self.store.tracked(cur)
        if as_of is None:
            return tracked
        if as_of < 0:
            raise PositionBeyondHeadError(f"--as-of {as_of}: positions start at 0")
        if as_of > tracked:
            raise PositionBeyondHeadError(
                f"--as-of {as_of} is past the projected position {tracked} (the journal "
                "head, once caught up); give a position at or before it"
            )
        return as_of

    def at_ms(self, position: int) -> int:
        """The commit time of the entry at ``position`` (or the last one before it)."""
        row = self.journal.predecessor(position + 1)
        return 0 if row is None else at_ms_of_state(row.state)

    def _when(self, position: int, as_of: int | None) -> int:
        """The time an answer is evaluated at: now for the journal as it stands (a lease
        expires with no entry to say so), else the commit time of the asked position."""
        committed = self.at_ms(position)
        return committed if as_of is not None else max(now_ms(), committed)

    def budgets(self, lineage: str | None = None, as_of: int | None = None) -> BudgetReport:
        with self.store.read() as cur:
            p = self._as_of(cur, as_of)
            where, params = self.store.subtree(lineage)
            rows = list(self.store.select(cur, "ledgers_as_of", (p, p, *params), where))
        return BudgetReport.from_rows(rows, p, self._when(p, as_of))

    def tree(self, lineage: str | None = None, as_of: int | None = None) -> TreeReport:
        with self.store.read() as cur:
            p = self._as_of(cur, as_of)
            where, params = self.store.subtree(lineage)
            nodes = list(self.store.select(cur, "nodes_as_of", (p, *params), where))
            ledgers = list(self.store.select(cur, "ledgers_as_of", (p, p, *params), where))
            workers = list(self.store.select(cur, "workers_as_of", (p, p, *params), where))
            samples = list(self.store.select(cur, "samples_as_of", (p, p, *params), where))
            claims = list(self.store.select(cur, "claims_as_of", (p, p)))
        at_ms = self._when(p, as_of)
        status = {row[L_LINEAGE]: _status(row, at_ms) for row in ledgers}
        gone = gone_cells(claims, at_ms)
        worker = {str(row[0]): worker_shown(row, gone) for row in workers}
        tokens = {row[L_LINEAGE]: int(row[L_SPENT]) for row in ledgers}  # tokens: axis 0
        burn = burns(ledgers, samples)
        out = [
            TreeNode(
                lineage=lin,
                parent=parent,
                depth=int(depth),
                kind=kind,
                position=int(pos),
                fanout=fanout,
                status=status.get(lin, "no-ledger"),
                worker=worker.get(lin),
                tokens_spent=tokens.get(lin),
                burn=burn.get(lin),
            )
            for lin, parent, depth, kind, pos, fanout in nodes
        ]
        return TreeReport(p, tuple(sorted(out, key=lambda n: n.lineage)))

    def slots(self, as_of: int | None = None) -> SlotsReport:
        with self.store.read() as cur:
            p = self._as_of(cur, as_of)
            cells = list(self.store.select(cur, "cells_as_of", (p, p)))
            slots = list(self.store.select(cur, "slots_as_of", (p, p)))
            queue = list(self.store.select(cur, "queue_as_of", (p, p)))
            claims = list(self.store.select(cur, "claims_as_of", (p, p)))
        return SlotsReport.from_rows(cells, slots, p, queue, claims, self._when(p, as_of))

    def counts(self) -> dict[str, int]:
        """Entries projected so far, by event type (every entry is counted once)."""
        with self.store.read() as cur:
            return {str(t): int(n) for t, n in self.store.select(cur, "counts", ())}
