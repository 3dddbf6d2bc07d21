"""The cell's read state: every worker's schedule and lifecycle, folded from the journal."""

from __future__ import annotations

from dataclasses import dataclass, field

from charter.authority import GrantMinted, LineageRevoked, SealedGrant
from charter.budgets import UsageRecorded
from charter.control import DelegationRequested, Outcome, WorkerScheduled, end_outcome
from charter.core import Budget
from charter.core.events import Event
from charter.ledger import JournalFold
from charter.runner.events import (
    CellClaimRenewed,
    CellStarted,
    WorkerEnded,
    WorkerKilled,
    WorkerResult,
    WorkerStarted,
    WorkerWaiting,
)
from charter.sandbox import SandboxExited, SandboxLeased
from charter.supervision import WorkerSampled

__all__ = ["WorkerRecord", "WorkersView"]


@dataclass
class WorkerRecord:
    """One scheduled worker as folded so far."""

    scheduled: WorkerScheduled
    position: int
    # Its stream's version at its (latest) schedule: 1, or more once it was moved off a
    # gone cell (a move is pinned to the stream holding only its schedules).
    version: int = 1
    sandbox_id: str | None = None
    host_uid: int | None = None
    exit_code: int | None = None  # its sandbox's command ended (SandboxExited)
    how: str = ""  # how it ended, as the sandbox measured it (SandboxExited)
    oom_kills: int = 0
    waiting: tuple[str, ...] = ()
    killed: str | None = None
    result: WorkerResult | None = None
    ended: WorkerEnded | None = None
    children: list[str] = field(default_factory=list)
    sampled: WorkerSampled | None = None  # its latest usage so far, while it runs
    # What its lease was charged (its UsageRecorded, summed): shown once the lease has
    # ended and left the lease book (LeaseBook.retire).
    charged: Budget | None = None

    @property
    def lineage(self) -> str:
        return self.scheduled.lineage

    @property
    def live(self) -> bool:
        return self.ended is None

    def exit_outcome(self) -> tuple[Outcome, int | None]:
        """How it ended, from its journaled exit (hold it only once it exited)."""
        return end_outcome(
            how=self.how,
            exit_code=self.exit_code or 0,
            oom_kills=self.oom_kills,
            killed=self.killed is not None,
        )


class WorkersView(JournalFold):
    """Workers by lineage, sandboxes' host uids, and each cell's incarnations."""

    types = (
        WorkerScheduled.type_name,
        WorkerStarted.type_name,
        WorkerWaiting.type_name,
        WorkerResult.type_name,
        WorkerKilled.type_name,
        WorkerEnded.type_name,
        SandboxLeased.type_name,
        SandboxExited.type_name,
        CellStarted.type_name,
        CellClaimRenewed.type_name,
        GrantMinted.type_name,
        LineageRevoked.type_name,
        WorkerSampled.type_name,
        DelegationRequested.type_name,
        UsageRecorded.type_name,
    )

    def __init__(self) -> None:
        super().__init__()
        self.workers: dict[str, WorkerRecord] = {}
        self.uids: dict[str, int] = {}  # sandbox id -> host uid (from its lease)
        self.running: dict[str, str] = {}  # sandbox id -> the worker it runs
        self.incarnations: dict[str, int] = {}
        # Each cell's newest incarnation's claim: when it lapses (None: no bound).
        self.claims: dict[str, int | None] = {}
        self.started: dict[str, CellStarted] = {}  # each cell's newest incarnation
        self.grants: dict[str, GrantMinted] = {}
        # Scheduled workers not ended yet, per cell: a following cell asks whether it is
        # idle after every step, and scanning every worker ever scheduled made each
        # step cost more the longer the cell ran.
        self.live_count: dict[str, int] = {}
        # Kills committed (by anyone) and not yet taken by the cell that acts on them.
        self._kills: list[str] = []
        self._revocations: list[str] = []  # likewise, revoked lineages
        # Delegations (docs/delegation.md): each delegate's caller, each caller's
        # delegates. A delegate is the caller's dependant though its lineage is under
        # its agent: it dies with the caller's interest, as a child does.
        self.delegated_by: dict[str, str] = {}
        self.delegates: dict[str, list[str]] = {}

    def apply(self, event: Event, position: int, at_ms: int) -> None:
        del at_ms
        if isinstance(event, LineageRevoked):
            self._revocations.append(str(event.lineage))
        elif isinstance(event, DelegationRequested):
            if event.delegate not in self.delegated_by:
                self.delegated_by[event.delegate] = event.caller
                self.delegates.setdefault(event.caller, []).append(event.delegate)
        elif isinstance(event, CellClaimRenewed):
            if self.incarnations.get(event.cell) == event.incarnation:
                self.claims[event.cell] = event.until_ms
        elif isinstance(event, UsageRecorded):
            w = self.workers.get(event.lineage)
            if w is not None:
                w.charged = event.amount if w.charged is None else w.charged + event.amount
        elif isinstance(event, WorkerScheduled | GrantMinted | SandboxLeased | CellStarted):
            self._apply_fact(event, position)
        else:
            self._apply_lifecycle(event)

    def _apply_fact(self, event: Event, position: int) -> None:
        match event:
            case WorkerScheduled():
                earlier = self.workers.get(event.lineage)
                if earlier is not None and earlier.live:  # replaced, as on_cell sees it
                    self.live_count[earlier.scheduled.cell] -= 1
                self.live_count[event.cell] = self.live_count.get(event.cell, 0) + 1
                version = 1 if earlier is None else earlier.version + 1
                self.workers[event.lineage] = WorkerRecord(event, position, version)
                parent = event.lineage.rpartition("/")[0]
                if parent in self.workers and earlier is None:
                    self.workers[parent].children.append(event.lineage)
            case GrantMinted():
                self.grants[str(event.lineage)] = event
            case SandboxLeased():
                self.uids[event.sandbox_id] = event.host_uid
            case CellStarted():
                self.incarnations[event.cell] = event.incarnation
                self.claims[event.cell] = event.claim_until_ms
                self.started[event.cell] = event
            case _:
                pass

    def _apply_lifecycle(self, event: Event) -> None:
        match event:
            case WorkerStarted():
                w = self.workers[event.lineage]
                w.sandbox_id, w.host_uid = event.sandbox_id, self.uids.get(event.sandbox_id)
                self.running[event.sandbox_id] = event.lineage
            case SandboxExited():
                lineage = self.running.get(event.sandbox_id)
                if lineage is not None:
                    w = self.workers[lineage]
                    w.exit_code, w.how = event.exit_code, event.how
                    w.oom_kills = event.usage.oom_kills
            case WorkerWaiting():
                self.workers[event.lineage].waiting = event.children
            case WorkerResult():
                self.workers[event.lineage].result = event
            case WorkerSampled():
                sampled = self.workers.get(event.lineage)
                if sampled is not None and sampled.ended is None:
                    sampled.sampled = event
            case WorkerKilled():
                self.workers[event.lineage].killed = event.reason
                self._kills.append(event.lineage)
            case WorkerEnded():
                w = self.workers[event.lineage]
                if w.ended is None:
                    self.live_count[w.scheduled.cell] -= 1
                w.ended = event
            case _:
                pass

    def take_revocations(self) -> list[str]:
        """The lineages whose ``LineageRevoked`` was folded since the last call."""
        taken, self._revocations = self._revocations, []
        return taken

    def take_kills(self) -> list[str]:
        """The lineages whose ``WorkerKilled`` was folded since the last call."""
        taken, self._kills = self._kills, []
        return taken

    def claim(self, cell: str) -> tuple[int, int | None]:
        """``cell``'s newest incarnation (0: none) and when its claim lapses."""
        return self.incarnations.get(cell, 0), self.claims.get(cell)

    def gone(self, cell: str, at_ms: int) -> bool:
        """Whether ``cell``'s newest incarnation is gone by time at ``at_ms``: it has
        not renewed its claim, which lapsed (one with no bound is never gone by time)."""
        until = self.claims.get(cell)
        return cell in self.incarnations and until is not None and at_ms >= until

    def on_cell(self, cell: str) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.scheduled.cell == cell]

    def live_descendants(self, lineage: str) -> list[WorkerRecord]:
        """Live workers below ``lineage``, shallowest first: a waiting parent dies before
        its children, so it never sees them end and carries on. The live delegates of
        ``lineage`` and of those below it come last (a delegate has no children of its
        own: it is minted with no depth left)."""
        prefix = lineage + "/"
        found = [w for k, w in self.workers.items() if k.startswith(prefix) and w.live]
        found.sort(key=lambda w: w.lineage.count("/"))
        if self.delegates:
            for caller in (lineage, *(w.lineage for w in found)):
                for delegate in self.delegates.get(caller, ()):
                    record = self.workers.get(delegate)
                    if record is not None and record.live:
                        found.append(record)
        return found

    def chain(self, lineage: str) -> tuple[SealedGrant, ...]:
        """The sealed grants from the root down to ``lineage``, as journaled."""
        parts = lineage.split("/")
        return tuple(self.grants["/".join(parts[: i + 1])].sealed() for i in range(len(parts)))
