"""The read state one process decides on, kept current incrementally.

A :class:`Views` is built once per composition root (:class:`charter.app.Charter`) and
shared by every command handler of that process and by its cell: the directory and
journaled grants (:class:`AuthorityView`), the lease book, cells and live population
(:class:`ResourceView`), and whatever a caller adds (the cell's workers). One read of
the journal from the views' position brings them all up to date, so a decision reads
what was committed since the last one, never the whole history again. Every decision
(and the cell) holds :attr:`Views.lock` while it reads them, decides and appends.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from charter.control.directory import AuthorityView
from charter.control.resources import ResourceView
from charter.ledger import Committed, Folds, Journal, JournalFold

__all__ = ["Views"]


class Views:
    """The directory, grants, leases, cells and live population, with their lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.authority = AuthorityView()
        self.resources = ResourceView()
        self._folds = Folds(self.authority, self.resources)

    @property
    def position(self) -> int:
        """The journal position every view has folded up to."""
        return self._folds.position

    def watch(self, fold: JournalFold) -> None:
        """Keep ``fold`` current with the others (one read for all)."""
        with self.lock:
            self._folds.add(fold)

    def refresh(self, journal: Journal) -> None:
        """Fold what was committed since the last refresh (hold :attr:`lock`)."""
        with self.lock:
            self._folds.refresh(journal)

    def applied(self, committed: Sequence[Committed]) -> None:
        """Fold this process's own commit without reading it back (when nothing else
        was committed in between; otherwise the next refresh reads it, in order)."""
        with self.lock:
            self._folds.applied(committed)
