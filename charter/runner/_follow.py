"""The cell's follower: committed entries in, decisions out, never an effect of its own.

Shaped like the eventsourcing library's followers (``policy(domain_event) → new
events``): :func:`start_policy` turns one committed ``SlotAdmitted`` into what the cell
does about it (start the worker, settle one that ended while it queued, or nothing);
:func:`kill_policy` turns the kills and revocations folded since the last look into the
``WorkerKilled`` to journal and the kills to carry out. The tracking position a
decision was made at is committed with its effect (a start's append carries it), so a
restarted cell never acts on an entry twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from charter.budgets import ResourceClass, SlotAdmitted
from charter.core import Event
from charter.ledger import Journal
from charter.runner._view import WorkerRecord, WorkersView
from charter.runner.events import WorkerKilled

__all__ = ["Follower", "Settle", "Start", "kill_policy", "revocation_kills", "start_policy"]


@dataclass(frozen=True)
class Start:
    """Start ``record``'s worker; ``position`` is its admission's (the tracking)."""

    record: WorkerRecord
    position: int


@dataclass(frozen=True)
class Settle:
    """``lineage`` ended while it queued: its slot goes back with nothing started."""

    lineage: str


Decision = Start | Settle
_ADMITTED = (SlotAdmitted.type_name,)


def start_policy(cell: str, event: Event, position: int, view: WorkersView) -> Decision | None:
    """What ``cell`` does about one committed entry: a processing slot admitted on it
    for a worker scheduled on it and not started yet is a start; for one that ended
    meanwhile, a settlement; anything else (another cell's, a coordinator resuming
    after a wait, a worker killed before it started: its kill ends it) is nothing."""
    if not isinstance(event, SlotAdmitted) or event.cell != cell:
        return None
    if event.resource is not ResourceClass.PROCESSING:
        return None
    w = view.workers.get(event.lineage)
    if w is None or w.scheduled.cell != cell or w.sandbox_id is not None:
        return None  # not a worker of ours, or one resuming after a wait
    if w.killed is not None and w.live:
        return None  # killed before it started: ended by the kill, never started
    if not w.live:
        return Settle(w.lineage)
    return Start(w, position)


def revocation_kills(cell: str, view: WorkersView) -> tuple[WorkerKilled, ...]:
    """For each revocation folded since the last look: one ``WorkerKilled`` for each
    live worker of ``cell`` at or below the revoked lineage, not killed yet."""
    kills: list[WorkerKilled] = []
    for lineage in view.take_revocations():
        top = view.workers.get(lineage)
        subtree = ([top] if top is not None else []) + view.live_descendants(lineage)
        reason = f"{lineage} was revoked"
        kills.extend(
            WorkerKilled(lineage=w.lineage, reason=reason)
            for w in subtree
            if w.live and w.killed is None and w.scheduled.cell == cell
        )
    return tuple(kills)


def kill_policy(cell: str, view: WorkersView) -> tuple[list[str], list[WorkerRecord]]:
    """The kills folded since the last look (whoever appended them) that ``cell``
    carries out: the started workers' lineages (their sandboxes are killed), and the
    workers never started (ended at once; they never start)."""
    sandboxes: list[str] = []
    never_started: list[WorkerRecord] = []
    for lineage in view.take_kills():
        w = view.workers.get(lineage)
        if w is None or w.scheduled.cell != cell or w.ended is not None:
            continue
        if w.sandbox_id is not None:
            sandboxes.append(lineage)
        else:
            never_started.append(w)
    return sandboxes, never_started


class Follower:
    """Reads the admissions committed since the tracked position (each once per
    process: what was passed over is final) and decides on each."""

    def __init__(self, cell: str, journal: Journal, view: WorkersView) -> None:
        self.cell = cell
        self.journal = journal
        self.view = view
        self.tracking = f"charter.cell.{cell}"
        self._scanned = 0  # admissions read up to here by this process
        # The tracked position, read once: after that only this incarnation's own starts
        # move it (to positions already scanned); another incarnation's would fence this
        # one, and a start already tracked is refused by the journal (AlreadyTracked).
        self._tracked: int | None = None

    def admitted(self) -> list[tuple[int, Event]]:
        """The admissions committed since the last read, with their positions, to be
        decided on one by one (:func:`start_policy`, on the views as they stand then:
        each start moves them). Hold the views' lock, with the views refreshed."""
        if self._tracked is None:
            self._tracked = self.journal.tracked_position(self.tracking)
        start, stop = max(self._tracked, self._scanned) + 1, self.view.position
        found = (
            [(e.position, e.event) for e in self.journal.entries(start, stop, types=_ADMITTED)]
            if start <= stop
            else []
        )
        self._scanned = max(self._scanned, stop)
        return found

    def reread_from(self, position: int) -> None:
        """The journal did not take the effect decided at ``position``: decide on it,
        and on what follows, again at the next read."""
        self._scanned = position - 1
