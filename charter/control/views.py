"""The read state one process decides on, kept current incrementally.

A :class:`Views` is built once per composition root (:class:`charter.app.Charter`) and
shared by every command handler of that process and by its cell: the directory and
journaled grants (:class:`AuthorityView`), the lease book, cells and live population
(:class:`ResourceView`), and whatever a caller adds (the cell's workers). One read of
the journal from the views' position brings them all up to date, so a decision reads
what was committed since the last one, never the whole history again. Every decision
(and the cell) holds :attr:`Views.lock` while it reads them, decides and appends.

Given a :class:`SnapshotFile`, the views start from the snapshot a process saved
(:meth:`Views.save`) when it matches the journal, and catch up from its position: a
new process does not fold the journal from its start (docs/decisions-and-views.md).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from charter.control import _snapshot
from charter.control.directory import AuthorityView
from charter.control.placement import Liveness
from charter.control.resources import ResourceView
from charter.ledger import Committed, Folds, Journal, JournalFold, SnapshotFile

__all__ = ["SNAPSHOT_EVERY", "Views"]

# A process saves the views when it closes if they moved this far past the snapshot
# it started from: a new process then catches up at most about this many entries.
SNAPSHOT_EVERY = 1000


class Views:
    """The directory, grants, leases, cells and live population, with their lock."""

    def __init__(self, snapshot: SnapshotFile | None = None) -> None:
        self.lock = threading.RLock()
        self.authority = AuthorityView()
        self.resources = ResourceView()
        self.liveness = Liveness()  # which cells run: where children may be placed
        self._folds = Folds(self.authority, self.resources, self.liveness)
        self._snapshot = snapshot
        self._tried = snapshot is None  # the snapshot is read once, before any fold
        self.snapshot_position = 0  # the position of the snapshot loaded or saved

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
            if not self._tried:
                self._tried = True
                self._load()
            self._folds.refresh(journal)

    def _load(self) -> None:
        """Start from the snapshot if it matches the journal; else stay at zero."""
        folds = (self.authority, self.resources, self.liveness)
        if self._snapshot is None or any(f.position for f in folds):
            return
        found = self._snapshot.load(_snapshot.version())
        if found is None:
            return
        try:
            _snapshot.decode(found.body, folds)
        except _snapshot.SnapshotRefusedError:
            # Fail safe: nothing of it was applied (decode is all or nothing).
            return
        if any(f.position != found.position for f in folds):
            # Not what the snapshot said it covers: back to a fold from zero (in
            # place: the services hold these objects).
            for fold in folds:
                fold.__init__()  # type: ignore[misc]
            return
        self.snapshot_position = found.position

    def save(self, *, every: int = SNAPSHOT_EVERY) -> bool:
        """Save the views as a snapshot if they moved ``every`` entries or more past the
        last one (True if saved). Derived state only: a lost save costs a longer fold."""
        with self.lock:
            position = self.authority.position
            if (
                self._snapshot is None
                or position != self.resources.position
                or position != self.liveness.position
                or position - self.snapshot_position < max(every, 1)
            ):
                return False
            try:
                body = _snapshot.encode((self.authority, self.resources, self.liveness))
            except _snapshot.SnapshotRefusedError:  # state it cannot encode: no snapshot
                return False
            if not self._snapshot.save(_snapshot.version(), position, body):
                return False
            self.snapshot_position = position
            return True

    def applied(self, committed: Sequence[Committed]) -> None:
        """Fold this process's own commit without reading it back (when nothing else
        was committed in between; otherwise the next refresh reads it, in order)."""
        with self.lock:
            self._folds.applied(committed)
