"""The cell's acts on committed verdicts, whoever appended them (the supervision loop,
an operator through ``charter verdict`` or the API, a replay).

Shaped like the rest of the follower (:mod:`charter.runner._follow`): a fold collects
the verdicts committed since the last look (:class:`VerdictsFold`), a policy picks
those this cell acts on (:func:`verdict_policy`: a worker it runs, in the very sandbox
the verdict names, not ended), and :class:`VerdictActs` carries each out after its
commit (docs/supervision.md, "Verdicts and what each does"):

- throttle: the sandbox's CPU quota is lowered (``SandboxControl.throttle``);
- pause: the sandbox is frozen (its wall clock and its lease's expiry keep running);
- resume: thawed, and its CPU quota restored;
- kill: ``WorkerKilled`` journaled, then frozen and killed with every other kill;
- quarantine: frozen, its workspace digested into the journal (``WorkspaceDigested``)
  with the worker's ``WorkerKilled``, its subtree revoked (one ``LineageRevoked``,
  pinned: a racing mint loses), then killed with the subtree, its sandbox destroyed as
  quarantined (``SandboxQuarantined`` in place of ``SandboxDiscarded``).

A verdict on a worker that has ended, never started here or runs in another sandbox is
nothing (never an error). A throttle or pause the host cannot make fails closed: the
worker is killed instead, the reason journaled.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

from charter.control import Views, WorkerLifecycle, revoke
from charter.core import CharterError, Event, Lineage
from charter.ledger import Journal, JournalFold
from charter.runner._driver import Driver
from charter.runner._view import WorkersView
from charter.runner.events import WorkerKilled
from charter.sandbox import (
    SandboxControl,
    SandboxDiscarded,
    SandboxQuarantined,
    SandboxUnavailableError,
    Slot,
    digest_workspace,
)
from charter.supervision import (
    KillVerdict,
    PauseVerdict,
    QuarantineVerdict,
    ResumeVerdict,
    ThrottleVerdict,
    Verdict,
    WorkspaceDigested,
)

__all__ = ["VerdictActs", "VerdictsFold", "verdict_policy", "why"]

_VERDICTS = (ThrottleVerdict, PauseVerdict, ResumeVerdict, KillVerdict, QuarantineVerdict)


class VerdictsFold(JournalFold):
    """The verdicts committed (by anyone) and not yet taken by the cell."""

    types = tuple(v.type_name for v in _VERDICTS)

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[tuple[int, Verdict]] = []

    def apply(self, event: Event, position: int, at_ms: int) -> None:
        del at_ms
        if isinstance(event, _VERDICTS):
            self._pending.append((position, event))

    def take(self) -> list[tuple[int, Verdict]]:
        """The verdicts folded since the last call, with their positions, in journal
        order."""
        taken, self._pending = self._pending, []
        return taken


def verdict_policy(cell: str, verdicts: list[Verdict], view: WorkersView) -> list[Verdict]:
    """The verdicts ``cell`` carries out: on a live worker scheduled on it and started in
    the sandbox the verdict names. Anything else (ended, never started, another cell's,
    an earlier sandbox's) is nothing."""
    acts: list[Verdict] = []
    for v in verdicts:
        w = view.workers.get(v.lineage)
        if w is None or w.scheduled.cell != cell or not w.live:
            continue
        if w.sandbox_id != v.sandbox_id:
            continue
        acts.append(v)
    return acts


def why(verdict: Verdict) -> str:
    """The verdict and its evidence in words, for the worker's journaled end."""
    parts = []
    for e in verdict.evidence:
        if e.signal == "operator":
            parts.append(
                f"by {e.operator or 'an operator'}" + (f": {e.reason}" if e.reason else "")
            )
        elif e.signal == "canary":
            parts.append(f"touched canary {e.canary}")
        else:
            parts.append(f"{e.signal} {e.observed} > {e.threshold}")
    kind = verdict.type_name.removesuffix("Verdict").lower()
    return f"{kind} verdict ({'; '.join(parts)})"


@dataclass
class VerdictActs:
    """Carries out the committed verdicts for one cell (see the module's docstring).
    ``kill_one`` journals a worker's ``WorkerKilled`` and carries it out;
    ``carry_out_kills`` acts on every kill and revocation folded so far."""

    cell: str
    journal: Journal
    views: Views
    view: WorkersView
    lifecycle: WorkerLifecycle
    driver: Callable[[], Driver | None]
    kill_one: Callable[[str, str], None]
    carry_out_kills: Callable[[], None]
    # Called before a quarantine reads the workspace (the supervisor stops watching it).
    before_digest: Callable[[str], None] = lambda lineage: None
    # Called with every verdict committed (by anyone) and its position, in journal order,
    # under the views' lock, before any is acted on (the supervisor folds its standing).
    on_committed: Callable[[list[tuple[int, Verdict]]], None] = lambda verdicts: None

    def __post_init__(self) -> None:
        self.fold = VerdictsFold()
        self.views.watch(self.fold)
        self._quarantined: set[str] = set()  # lineages whose sandbox ends quarantined

    def carry_out(self) -> None:
        """Act on every verdict folded since the last look (call with the views fresh)."""
        with self.views.lock:
            taken = self.fold.take()
            if taken:
                self.on_committed(taken)
            acts = verdict_policy(self.cell, [v for _, v in taken], self.view)
        for verdict in acts:
            self._act(verdict)

    def sandbox_end(self, sandbox_id: str, lineage: str) -> Event:
        """How ``lineage``'s sandbox's end is journaled: quarantined or discarded."""
        if lineage in self._quarantined:
            w = self.view.workers.get(lineage)
            reason = (None if w is None else w.killed) or "quarantine verdict"
            return SandboxQuarantined(sandbox_id=sandbox_id, reason=reason)
        return SandboxDiscarded(sandbox_id=sandbox_id)

    def _act(self, verdict: Verdict) -> None:
        driver = self.driver()
        slot = None if driver is None else driver.slot(verdict.lineage)
        if driver is None or slot is None or slot.sandbox_id != verdict.sandbox_id:
            return  # it ended meanwhile, or was never this process's to run
        control = SandboxControl(slot.spec)
        try:
            match verdict:
                case ThrottleVerdict():
                    control.throttle(verdict.quota_permille)
                case PauseVerdict():
                    control.freeze()
                case ResumeVerdict():
                    control.thaw()
                    control.restore()
                case KillVerdict():
                    self.kill_one(verdict.lineage, why(verdict))
                case QuarantineVerdict():
                    self._quarantine(verdict, driver, slot, control)
        except SandboxUnavailableError as error:
            if isinstance(verdict, ResumeVerdict):
                return  # nothing left to resume: it is ending
            # Fail closed: a throttle or pause that cannot be made is a kill.
            self.kill_one(verdict.lineage, f"{why(verdict)} could not be made ({error}): killed")

    def _quarantine(
        self, verdict: QuarantineVerdict, driver: Driver, slot: Slot, control: SandboxControl
    ) -> None:
        """Freeze, digest the workspace, journal the digest with the kill, revoke the
        subtree, kill it all (the freeze failing kills all the same)."""
        with contextlib.suppress(SandboxUnavailableError):
            control.freeze()
        lineage = verdict.lineage
        self.before_digest(lineage)
        try:
            d = digest_workspace(slot.spec)
            digested = WorkspaceDigested(
                lineage=lineage, sandbox_id=slot.sandbox_id, digest=d.digest,
                files=d.files, bytes=d.bytes, truncated=d.truncated,
            )  # fmt: skip
        except (SandboxUnavailableError, OSError) as error:
            digested = WorkspaceDigested(
                lineage=lineage, sandbox_id=slot.sandbox_id, error=str(error)
            )
        reason = why(verdict)
        driver.quarantine(lineage, reason)
        self._quarantined.add(lineage)
        with self.views.lock:
            self.views.refresh(self.journal)
            w = self.view.workers.get(lineage)
            events: list[Event] = [digested]
            if w is not None and w.live and w.killed is None and w.exit_code is None:
                events.append(WorkerKilled(lineage=lineage, reason=reason))
            self.lifecycle.record(events)
        try:
            revoke(self.journal, self.views, Lineage(lineage), reason)
        except CharterError as error:  # its own kill stands; the subtree's is reported
            print(f"charter cell {self.cell}: revoking {lineage}: {error}", file=sys.stderr)
        self.carry_out_kills()
