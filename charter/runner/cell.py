"""The cell: turns committed events into running workers, and nothing else.

It follows the journal from its tracked position (the process recorder's tracking row,
committed in the same transaction as the start it records) and acts only on committed
entries: record, commit, then act. For each worker scheduled on it, when the worker
holds a processing slot (``SlotAdmitted``), in order:

1. lease a warm-pool slot, narrowed to the worker's own lease and grant (caps, wall
   clock up to its expiry, egress allow-list at the cell's egress broker);
2. journal ``SandboxLeased`` (lineage, lease, grant digest), ``WorkerStarted`` and
   ``SandboxStarted`` in one append, pinned to the worker's stream (so it starts at
   most once) and carrying the tracking position (so a replay skips it);
3. exec the worker (only after that commit);
4. on exit, journal ``SandboxExited`` with the measured usage, charge it to the lease,
   destroy the sandbox, and journal in one append the lease returned, ``WorkerEnded``,
   ``SandboxDiscarded`` and ``SlotReleased`` with the admission of whoever queued next.

A parent that stops waiting (it ended, or its wait timed out) has every live descendant
killed, each ``WorkerKilled`` committed before the kill. A cell that starts after a crash
fails every worker its previous incarnation had started (never resumes one), kills what
is left of their sandboxes, returns their leases and slots.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from charter.app import Charter
from charter.authority import SealedGrant
from charter.budgets import CapInputs, ResourceClass, SlotAdmitted
from charter.control import worker_stream
from charter.core import Budget, CharterError, Event, Lineage, now_ms
from charter.ledger import (
    AlreadyTrackedError,
    AppendConflictError,
    AppendFailedError,
    Committed,
    OutcomeUnknownError,
)
from charter.runner._caps import WorkerCaps, worker_caps
from charter.runner._custody import Custody, custody_seed
from charter.runner._filler import PoolFiller
from charter.runner._journal_allowance import JournalAllowance
from charter.runner._kill import kill_uid, kill_uids
from charter.runner._sink import BrokerEvents
from charter.runner._view import WorkerRecord, WorkersView
from charter.runner.errors import (
    CellSupersededError,
    LeaseSpentError,
    NotAWorkerError,
)
from charter.runner.events import (
    RESULT_CAP,
    CellStarted,
    WorkerEnded,
    WorkerKilled,
    WorkerResult,
    WorkerStarted,
)
from charter.sandbox import (
    EgressBroker,
    KeyBroker,
    SandboxBudgetError,
    SandboxDiscarded,
    SandboxExited,
    SandboxStarted,
    Slot,
    WarmPool,
    default_state_dir,
    hold_uid,
)
from charter.sandbox.launcher import leased_event

__all__ = ["Cell", "kill_uid"]

_STDERR_TAIL = 1000  # bytes of a failed worker's stderr kept in its end event
_SETTLE_TRIES = 5  # a failed driver's settlement, each on a fresh read of the journal
_SETTLE_PAUSE_S = 0.2
_DESCENDANTS_WAIT_S = 10.0  # a parent's end waits this long for its killed children
Outcome = Literal["exited", "killed", "failed"]


class Cell:
    """One cell process: ``open`` (journals the incarnation, recovers), then ``step`` or
    ``run``; ``close`` at the end. The Python API for workers' requests (``spawn``,
    ``wait``, ``result``, ``sign``) is what the door calls, with the caller resolved
    from the sandbox's host uid."""

    def __init__(
        self,
        app: Charter,
        *,
        cell: str,
        budget: Budget,
        template: Path | None = None,
        state_dir: Path | None = None,
        key_broker: KeyBroker | None = None,
        egress_broker: EgressBroker | None = None,
        pool_capacity: int | None = None,
    ) -> None:
        # The cell receives the composition root's services and views; it builds none.
        self.app = app
        self.journal = app.journal
        self.keys = app.keys
        self.cell = cell
        self.template = template
        self.budget = budget
        self.state_dir = state_dir
        self.key_broker = key_broker or KeyBroker()
        self.egress_broker = egress_broker
        self.pool_capacity = pool_capacity
        self.tracking = f"charter.cell.{cell}"
        self.view = WorkersView()
        app.views.watch(self.view)  # one read of the journal keeps every view current
        self.resources = app.views.resources
        self.budgets = app.budgets()
        self.admission = app.admission()
        self.incarnation = 0
        self.pool: WarmPool | None = None
        self._filler: PoolFiller | None = None
        self._lock = app.views.lock  # the folds and the process's decisions and appends
        self._slots: dict[str, Slot] = {}  # lineage -> its leased slot
        self._by_uid: dict[int, str] = {}  # sandbox host uid -> lineage
        self.custody = Custody(self.keys, self.key_broker)
        self._threads: list[threading.Thread] = []
        self._scanned = 0  # admissions read up to here by this process
        self.draining = False  # start nothing more; stop once what runs has finished
        self._parked_base = 1  # idle sandboxes parked ahead: the processing cap (open)
        self.changed = threading.Condition(self._lock)
        # Run for each worker recovery fails, before its lease returns (the door settles
        # the model calls a dead incarnation left unsettled: docs/model-door.md).
        self.before_recovered_end: Callable[[str], object] = lambda _lineage: None
        self.journal_allowance = JournalAllowance(
            self, lambda lin, at: self.resources.book.remaining(lin, at).egress_bytes,
            self.journal.append,
        )  # fmt: skip

    def host_load(self, cores: int, reserve: int) -> CapInputs:
        """The adaptive cap's inputs, as the composition root takes them."""
        return self.app.host_load(cores, reserve)

    def refresh(self) -> None:
        """Bring every view of the process up to date (hold the lock)."""
        self.app.views.refresh(self.journal)

    def applied(self, committed: tuple[Committed, ...]) -> None:
        self.app.views.applied(committed)

    # -- life ------------------------------------------------------------------------

    def open(self) -> CellStarted:
        """Journal this incarnation, recover from the last one, build the pool."""
        template = self.template or self._own_template()
        with self._lock:
            self.refresh()
            state = self.resources.cells.get(self.cell)
            self.incarnation = self.view.incarnations.get(self.cell, 0) + 1
            started = CellStarted(
                cell=self.cell,
                incarnation=self.incarnation,
                pid=os.getpid(),
                host=socket.gethostname(),
            )
            self.journal.append([started], expect={f"cellrun:{self.cell}": self.incarnation - 1})
            self._recover()
        capacity = self.pool_capacity or (
            state.caps.get(ResourceClass.PROCESSING, 0)
            + state.caps.get(ResourceClass.COORDINATION, 0)
        )
        base = self.state_dir or default_state_dir()
        if self.egress_broker is None:  # every worker's way out: its grant's destinations
            self.egress_broker = EgressBroker(base / f"egress-{self.cell}-{os.getpid()}.sock")
        # A waiting coordinator keeps its sandbox while it holds a coordination slot
        # instead of a processing one: the pool holds room for both.
        # Idle sandboxes parked ahead of demand: as many as may run at once, plus the
        # workers queued for a slot (see _park_for_demand), never the whole capacity
        # while idle (a waiting coordinator's room is built when it is needed).
        self._parked_base = max(1, min(state.caps.get(ResourceClass.PROCESSING, 0), capacity))
        self.pool = WarmPool(
            template,
            self.budget,
            max(1, capacity),
            parked=self._parked_base,
            sink=BrokerEvents(self.journal),
            egress=self.egress_broker,
            keys=self.key_broker,
            state_dir=self.state_dir,
            name=self.cell,
        )
        self._filler = PoolFiller(self.pool)
        self._filler.start()
        return started

    def _own_template(self) -> Path:
        """The workspace every worker starts from: empty but for the door's client
        (``/workspace/charter_door.py``), read-only under each worker's overlay."""
        base = self.state_dir or default_state_dir()
        path = base / f"cell-{self.cell}-template"
        path.mkdir(parents=True, exist_ok=True)
        base.chmod(0o755)
        path.chmod(0o755)
        client = path / "charter_door.py"
        client.write_bytes(Path(__file__).with_name("client.py").read_bytes())
        client.chmod(0o644)
        return path

    def close(self) -> None:
        """Kill every live worker of this cell, then stop: the kills are journaled in
        one append and carried out in one pass, and nothing is rebuilt for them (the
        filler stops first)."""
        if self._filler is not None:
            self._filler.stop_building()
        with self._lock:
            self.refresh()
            reason = "the cell is shutting down"
            kills = [
                WorkerKilled(lineage=w.lineage, reason=reason)
                for w in self.view.on_cell(self.cell)
                if w.live and w.sandbox_id and w.killed is None and w.exit_code is None
            ]
            if kills:
                self.applied(self.journal.append(kills))
            # Every sandbox still held here dies with the cell: those just journaled,
            # and those another writer killed or ended (a newer incarnation failed
            # them) whose kill this cell had not carried out yet.
            held = {slot.host_uid for slot in self._slots.values()}
            if held:
                kill_uids(held)
        self._carry_out_kills()
        for thread in list(self._threads):
            thread.join(timeout=30)
        if self.pool is not None:
            self.pool.close()
        if self._filler is not None:
            self._filler.stop()
        self.key_broker.close()
        if self.egress_broker is not None:
            self.egress_broker.close()

    def __enter__(self) -> Cell:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recover(self) -> None:
        """Fail every worker a previous incarnation started and did not end: journal
        its kill, then kill what survives of its sandbox, journal its end, return its
        lease and slot. A survivor is killed only under its host uid held here: a uid
        another holder has taken since belongs to that holder's sandbox, never to be
        touched (its processes are not the dead worker's)."""
        failed: list[str] = []
        state = self.state_dir or default_state_dir()
        for w in self.view.on_cell(self.cell):
            if not (w.live and w.sandbox_id is not None):
                continue
            reason = f"driver died: cell {self.cell} restarted (incarnation {self.incarnation})"
            if w.killed is None:  # the kill is journaled before it is done
                self.applied(self.journal.append([WorkerKilled(lineage=w.lineage, reason=reason)]))
            if w.host_uid is not None:
                held = hold_uid(state, w.host_uid)
                if held is not None:
                    with held:
                        kill_uid(w.host_uid)
            self.before_recovered_end(w.lineage)
            if w.exit_code is None:
                self._end(w, "failed", None, reason, discard=True)
            else:  # it had exited; only its teardown was cut short
                self._end(w, "exited", w.exit_code, reason, discard=True)
            failed.append(w.lineage)
        for lineage in failed:  # nobody waits for their children any more
            self._kill_descendants(lineage, f"parent {lineage} failed: its driver died")

    # -- following -------------------------------------------------------------------

    def step(self) -> int:
        """Act on every processing slot admitted on this cell since the tracked position
        (read once per process: what was passed over is final); return how many
        workers were started."""
        started = 0
        self._check_not_superseded()
        self._admit_room()
        with self._lock:
            tracked = self.journal.tracked_position(self.tracking)
            self.refresh()
            self._check_not_superseded()
            start, stop = max(tracked, self._scanned) + 1, self.view.position
            admitted = (
                [
                    (e.position, e.event)
                    for e in self.journal.entries(start, stop, types=("SlotAdmitted",))
                ]
                if start <= stop
                else []
            )
            self._scanned = max(self._scanned, stop)
        self._carry_out_kills()  # whoever committed them
        self._park_for_demand()
        if self.draining:
            return 0  # nothing more is started; what runs finishes
        for position, event in admitted:
            if not isinstance(event, SlotAdmitted) or event.cell != self.cell:
                continue
            if event.resource is not ResourceClass.PROCESSING:
                continue
            with self._lock:
                w = self.view.workers.get(event.lineage)
            if w is None or w.scheduled.cell != self.cell or w.sandbox_id is not None:
                continue  # not a worker of ours, or one resuming after a wait
            if w.killed is not None and w.live:
                continue  # killed before it started: ended by the kill, never started
            if not w.live:
                self._settle(w.lineage, ())
                continue
            outcome = self._start(w, position)
            if outcome is None:  # the journal did not take the start: read it again
                self._scanned = position - 1
                break
            started += outcome
        return started

    def _park_for_demand(self) -> None:
        """Park ahead for the workers queued here: the processing cap, plus one for each
        worker waiting for a slot, up to the pool's capacity (an idle cell parks only
        the processing cap)."""
        if self.pool is None or self._filler is None:
            return
        with self._lock:
            state = self.resources.cells.cells().get(self.cell)
            queued = len(state.queued[ResourceClass.PROCESSING]) if state is not None else 0
        want = min(self.pool.capacity, self._parked_base + queued)
        if want != self.pool.parked_target:
            self.pool.parked_target = want
            self._filler.wake()

    def _check_not_superseded(self) -> None:
        """Raise :class:`CellSupersededError` once a newer incarnation of this cell has
        started (its ``CellStarted`` is in the view): only the newest one acts."""
        newest = self.view.incarnations.get(self.cell, 0)
        if self.incarnation and newest > self.incarnation:
            raise CellSupersededError(
                f"cell {self.cell}: incarnation {newest} started, so this one "
                f"({self.incarnation}) stops; its workers were failed by the newer one"
            )

    def _admit_room(self) -> None:
        """Admit queued workers when the cell has room no release will announce (a
        fan-out queued while the host was loaded, or before the cell was configured)."""
        with self._lock:
            if self.admission.admit_room(self.cell, self.live):
                self.changed.notify_all()

    def run(self, until: Callable[[], bool] = lambda: False, poll_s: float = 0.01) -> None:
        """Follow the journal until ``until()`` is true."""
        while not until():
            if self.step() == 0:
                head = self.journal.head()
                with self.changed:
                    if head is None or head[0] <= self.view.position:
                        self.changed.wait(poll_s)

    def running(self) -> int:
        """How many workers this cell runs now (their sandboxes held here)."""
        with self._lock:
            return len(self._slots)

    def idle(self) -> bool:
        """Nothing of this cell's is running or waiting to run."""
        with self._lock:
            self.refresh()
            return not self.view.live_count.get(self.cell, 0)

    # -- one worker --------------------------------------------------------------------

    def _start(self, w: WorkerRecord, position: int) -> int | None:
        if self.pool is None:
            raise CharterError("open the cell before following the journal")
        command = w.scheduled.command
        # The worker's lineage and every ancestor's: a revocation of any of them lands
        # on that stream, and the start is pinned to them all, so a worker is never
        # started after a revocation above it committed.
        lineage = Lineage(w.lineage)
        chain = [str(lineage), *(str(a) for a in lineage.ancestors())]
        with self._lock:
            pins = {stream: self.journal.stream_version(stream) for stream in chain}
            self.refresh()
            revoked = self.app.views.authority.revoked_above(lineage)
        if revoked is not None:
            self._carry_out_kills()  # the revocation ends it, journaled, never started
            return 0
        try:  # fail closed: nothing left on its lease, no start; the worker ends
            grant = self._grant(w.lineage)
            caps = self._caps(w.lineage, grant)
            slot = self.pool.lease(
                caps.egress,
                timeout=60.0,
                lineage=w.lineage,
                grant_digest=w.scheduled.grant_digest,
                budget=caps.budget,
            )
        except (LeaseSpentError, SandboxBudgetError) as error:
            self._end(w, "failed", None, f"not started: {error}", discard=False)
            return 0
        try:
            self.custody.issue(w.lineage, grant, slot.sandbox_id)
        except CharterError as error:  # fail closed: no key, no start; the worker ends
            self._give_back(slot)
            self._end(w, "failed", None, f"no custody key: {error}", discard=False)
            return 0
        events: list[Event] = [
            leased_event(
                slot.spec,
                slot.budget,
                self.pool.name,
                caps.egress,
                lineage=w.lineage,
                grant_digest=w.scheduled.grant_digest,
            ),
            WorkerStarted(
                lineage=w.lineage,
                cell=self.cell,
                incarnation=self.incarnation,
                sandbox_id=slot.sandbox_id,
            ),
            SandboxStarted(
                sandbox_id=slot.sandbox_id,
                pid=slot.proc.pid if slot.proc else 0,
                command=command,
            ),
        ]
        try:
            with self._lock:
                committed = self.journal.append(
                    events,
                    # the schedule and nothing since; no revocation above it since
                    # ... and this incarnation still the newest: a superseded one
                    # never starts anything
                    expect={
                        worker_stream(w.lineage): 1,
                        f"cellrun:{self.cell}": self.incarnation,
                        **pins,
                    },
                    tracking=(self.tracking, position),
                )
                self.applied(committed)
                self._slots[w.lineage] = slot
                self._by_uid[slot.host_uid] = w.lineage
        except (AppendConflictError, AlreadyTrackedError, AppendFailedError) as error:
            # A stream it was decided on moved (killed, revoked, or only a sibling's
            # fan-out: decided again from this position), already started by another
            # incarnation, or the journal refused the record (tried again): no record,
            # no start.
            self.custody.release(w.lineage)
            self._give_back(slot)
            return 0 if isinstance(error, AlreadyTrackedError) else None
        thread = threading.Thread(
            target=self._drive, args=(w, slot, command), name=f"worker-{slot.sandbox_id}"
        )
        self._threads.append(thread)
        thread.start()
        return 1

    def _drive(self, w: WorkerRecord, slot: Slot, command: tuple[str, ...]) -> None:
        """The worker's driver thread. Whatever goes wrong on it (an append whose
        outcome is unknown, a refused append, a sandbox that died before it ran) is
        caught and the worker settled: a driver never leaves a slot held or the queue
        stuck."""
        try:
            self._run_worker(w, slot, command)
        except Exception as error:  # noqa: BLE001 - every failure is settled, below
            self._settle_failed_driver(w, error)

    def _settle_failed_driver(self, w: WorkerRecord, error: Exception) -> None:
        """The driver of ``w`` failed part-way: its sandbox is destroyed, then whatever
        of its end is not in the journal yet (the end, the lease's return, its slots)
        is settled on the journal as it is read afresh (an append whose outcome was
        unknown may have committed). Tried a few times; what still cannot be settled is
        reported on stderr with the worker named, and the cell goes on."""
        self._destroy(w.lineage)
        why = f"its driver failed: {type(error).__name__}: {error}"
        last: Exception = error
        for _ in range(_SETTLE_TRIES):
            try:
                with self._lock:
                    self.refresh()
                    record = self.view.workers.get(w.lineage)
                if record is None:
                    return
                if record.ended is not None:  # the end did commit: free what it holds
                    self._settle(w.lineage, ())
                    return
                code = record.exit_code
                self._end(record, "failed" if code is None else "exited", code, why, discard=True)
            except Exception as again:  # noqa: BLE001 - tried again on a fresh read
                last = again
                time.sleep(_SETTLE_PAUSE_S)
            else:
                return
        print(
            f"charter cell {self.cell}: could not settle {w.lineage} after {why}; last "
            f"error: {type(last).__name__}: {last}",
            file=sys.stderr,
        )

    def _run_worker(self, w: WorkerRecord, slot: Slot, command: tuple[str, ...]) -> None:
        """Exec (its start is committed), wait, tear down."""
        outcome = slot.run(list(command), capture=True, max_output_bytes=RESULT_CAP)
        usage = outcome.usage
        with self._lock:
            self.journal.append(
                [
                    SandboxExited(
                        sandbox_id=slot.sandbox_id,
                        exit_code=outcome.exit_code,
                        how=outcome.how,
                        usage=usage,
                    )
                ]
            )
            self.refresh()
            record = self.view.workers[w.lineage]
        if record.result is None and outcome.stdout:
            # A worker that never used the door answers with what it printed.
            self.journal_result(w.lineage, outcome.stdout)
        spent = Budget(
            tokens=0,
            wall_ms=usage.wall_ms,
            cpu_ms=usage.cpu_ms,
            mem_bytes=usage.memory_peak_bytes,
            egress_bytes=usage.egress_bytes,
        )
        with contextlib.suppress(CharterError):  # the lease ended first (refusal journaled)
            self.budgets.record_usage(w.lineage, spent)
        outcome_kind: Outcome = "killed" if record.killed is not None else "exited"
        # Its children die with its interest in them (each kill journaled first), and
        # end before it does: its lease's return ends theirs, and what they used must
        # be charged while their leases are live.
        self._kill_descendants(w.lineage, f"parent {w.lineage} ended")
        self._wait_for_descendants(w.lineage)
        reason = record.killed or ""
        if not reason and outcome.how == "wall_clock":
            # The deadline was journaled with the lease (SandboxLeased.wall_ms).
            reason = "its lease's wall clock or expiry ran out: killed by the sandbox"
        if not reason and outcome.exit_code != 0 and outcome.stderr:
            reason = "stderr: " + outcome.stderr[-_STDERR_TAIL:].decode("utf-8", "replace")
        # The sandbox is destroyed before its slot is given back: never oversubscribed.
        self._destroy(w.lineage)
        self._end(record, outcome_kind, outcome.exit_code, reason, discard=True)

    def _wait_for_descendants(self, lineage: str) -> None:
        """Until no descendant of ``lineage`` that this cell runs is left unended (their
        drivers charge and journal them), at most ``_DESCENDANTS_WAIT_S``."""
        deadline = time.monotonic() + _DESCENDANTS_WAIT_S
        with self.changed:
            while True:
                self.refresh()
                running = [
                    d for d in self.view.live_descendants(lineage) if d.lineage in self._slots
                ]
                left = deadline - time.monotonic()
                if not running or left <= 0:
                    return
                self.changed.wait(min(left, 0.05))

    def _give_back(self, slot: Slot) -> None:
        """Discard a leased slot (never re-parked: a sandbox runs one worker) and have
        the filler build its replacement off the follower's path."""
        if self.pool is not None:
            self.pool.release(slot, refill=False)
        if self._filler is not None:
            self._filler.wake()

    def _destroy(self, lineage: str) -> None:
        with self._lock:
            slot = self._slots.pop(lineage, None)
            if slot is not None:
                self._by_uid.pop(slot.host_uid, None)
        self.custody.release(lineage)
        if slot is not None:
            self._give_back(slot)

    def _end(
        self,
        w: WorkerRecord,
        outcome: Outcome,
        exit_code: int | None,
        reason: str,
        *,
        discard: bool,
    ) -> None:
        """Journal the end, return the unspent lease, release whichever slot it holds
        and admit whoever queued next, all in one append pinned to the lease's stream
        and the cell's (one commit less per worker than returning the lease on its own).
        A lease that had ended already is refused (the refusal journaled) and the rest
        is appended without it; one that could not be returned in that append (its
        streams kept moving, or the journal refused it) is returned on its own first,
        as before."""
        with self._lock:
            self.refresh()
            current = self.view.workers.get(w.lineage)
        if current is not None and current.ended is not None:
            # Ended already (a newer incarnation failed it, or an end whose outcome was
            # unknown did commit): never a second end; free what this cell still holds.
            self._settle(w.lineage, ())
            return
        ended = WorkerEnded(
            lineage=w.lineage,
            outcome=outcome,
            exit_code=exit_code,
            sandbox_id=w.sandbox_id,
            reason=reason,
        )
        extra: list[Event] = [ended]
        if discard and w.sandbox_id is not None:
            extra.append(SandboxDiscarded(sandbox_id=w.sandbox_id))
        settle = tuple(extra)
        with self._lock:  # the settlement's pin on the cell's stream holds until it commits
            try:
                self.budgets.release(w.lineage, then=lambda: self._settlement(w.lineage, settle))
            except (AppendConflictError, AppendFailedError):  # nothing written: two appends
                with contextlib.suppress(CharterError):
                    self.budgets.release(w.lineage)
            except OutcomeUnknownError:
                raise  # it may have committed: not decided again
            except CharterError:
                pass  # already ended (expired, or an ancestor's): refused, and journaled so
            else:
                self.changed.notify_all()
                return
        self._settle(w.lineage, settle)

    def _settle(self, lineage: str, extra: tuple[Event, ...]) -> None:
        """The settlement of ``lineage`` (its slots back, the queue's head admitted),
        appended pinned to the cell's stream."""
        with self._lock:
            if self.admission.settle(self.cell, lineage, extra, self.live):
                self.changed.notify_all()

    def _settlement(
        self, lineage: str, extra: tuple[Event, ...]
    ) -> tuple[list[Event], dict[str, int]]:
        """The settlement's events and pins, for the same append as the lease's return
        (hold the lock until it commits)."""
        return self.admission.settlement(self.cell, lineage, extra, self.live)

    def live(self, lineage: str) -> bool:
        """Whether ``lineage`` is not known to have ended (hold the lock)."""
        w = self.view.workers.get(lineage)
        return w is None or w.live

    # -- kills -----------------------------------------------------------------------

    def kill(self, lineage: str, reason: str) -> None:
        """Kill ``lineage`` and its live descendants, each ``WorkerKilled`` committed
        before its kill. A worker not started yet is ended at once and never starts."""
        self._kill_descendants(lineage, reason)
        self._kill_one(lineage, reason)

    def _kill_descendants(self, lineage: str, reason: str) -> None:
        with self._lock:
            self.refresh()
            below = self.view.live_descendants(lineage)
        for w in below:
            self._kill_one(w.lineage, reason)

    def _kill_one(self, lineage: str, reason: str) -> None:
        """Journal ``WorkerKilled`` for ``lineage``; the kill itself is carried out, as
        every committed kill is, by :meth:`_carry_out_kills`."""
        with self._lock:
            self.refresh()
            w = self.view.workers.get(lineage)
            if w is None or not w.live or w.killed is not None or w.exit_code is not None:
                return  # gone, being killed, or already exited by itself
            self.applied(self.journal.append([WorkerKilled(lineage=lineage, reason=reason)]))
        self._carry_out_kills()

    def _carry_out_kills(self) -> None:
        """Act on every ``WorkerKilled`` and ``LineageRevoked`` folded since the last
        look, whoever appended it (this cell, the CLI, the API, another process).

        A revocation becomes a ``WorkerKilled`` for each live worker of this cell in the
        revoked subtree, journaled (in one append) before any is killed. Then every kill
        taken from the view is carried out once: the sandboxes of started workers are
        killed together (their drivers then journal their usage and ends, as killed);
        a worker never started is ended at once and never starts. A sandbox is killed
        only while this cell holds its slot (so its host uid is still that sandbox's),
        under the lock that gives slots back."""
        never_started: list[WorkerRecord] = []
        with self._lock:
            self._journal_revocation_kills()
            uids: set[int] = set()
            for lineage in self.view.take_kills():
                w = self.view.workers.get(lineage)
                if w is None or w.scheduled.cell != self.cell or w.ended is not None:
                    continue
                slot = self._slots.get(lineage)
                if slot is not None:
                    uids.add(slot.host_uid)
                elif w.sandbox_id is None:
                    never_started.append(w)
            if uids:
                kill_uids(uids)
        for w in never_started:
            self._end(w, "killed", None, w.killed or "killed", discard=False)

    def _journal_revocation_kills(self) -> None:
        """For each revocation folded since the last look: one ``WorkerKilled`` for each
        live worker of this cell at or below the revoked lineage (hold the lock)."""
        kills: list[Event] = []
        for lineage in self.view.take_revocations():
            top = self.view.workers.get(lineage)
            subtree = ([top] if top is not None else []) + self.view.live_descendants(lineage)
            reason = f"{lineage} was revoked"
            kills.extend(
                WorkerKilled(lineage=w.lineage, reason=reason)
                for w in subtree
                if w.live and w.killed is None and w.scheduled.cell == self.cell
            )
        if kills:
            self.applied(self.journal.append(kills))

    # -- the workers' requests (the door calls these) ---------------------------------

    def knows_uid(self, host_uid: int) -> bool:
        """Whether ``host_uid`` is the sandbox of a live worker of this cell (called on
        the door's accepting thread: it must not block)."""
        return host_uid in self._by_uid

    def lineage_of(self, host_uid: int) -> str:
        with self._lock:
            lineage = self._by_uid.get(host_uid)
        if lineage is None:
            raise NotAWorkerError("no live worker of this cell runs as this peer")
        return lineage

    def journal_result(self, lineage: str, data: bytes) -> str:
        """Journal ``lineage``'s answer: one per worker, charged to its journal allowance
        first (``_journal_allowance``), refused if it gave one already."""
        return self.journal_allowance.journal_result(lineage, data, self._result_of)

    def _result_of(self, lineage: str) -> WorkerResult | None:
        w = self.view.workers.get(lineage)
        return None if w is None else w.result

    def sign(self, lineage: str, tag: str, message: bytes) -> bytes:
        """Sign for ``lineage`` with the key issued to its sandbox (and only that one)."""
        with self._lock:
            slot = self._slots.get(lineage)
        if slot is None:
            raise NotAWorkerError(f"{lineage} holds no key here")
        return self.custody.sign(lineage, tag, message, slot.sandbox_id)

    # -- caps --------------------------------------------------------------------------

    def _grant(self, lineage: str) -> SealedGrant:
        """``lineage``'s committed grant, parsed (a start parses it once, for the caps
        and the custody key: each parse validates the whole grant)."""
        with self._lock:
            self.refresh()
            minted = self.view.grants.get(lineage)
        if minted is None:
            raise LeaseSpentError(f"{lineage} has no committed grant")
        return minted.sealed()

    def _caps(self, lineage: str, grant: SealedGrant) -> WorkerCaps:
        """The sandbox caps of ``lineage``: its lease and ``grant`` as committed, now."""
        with self._lock:
            self.refresh()
            book = self.resources.book
            at = now_ms()
            return worker_caps(
                self.budget,
                book.remaining(lineage, at),
                book.deadline(lineage),
                grant.grant.terms,
                at,
            )

    def custody_seed(self, lineage: str) -> bytes:
        """``lineage``'s custody seed (its committed grant's subject key, or refused)."""
        with self._lock:
            minted = self.view.grants.get(lineage)
        return custody_seed(self.keys, lineage, None if minted is None else minted.sealed())
