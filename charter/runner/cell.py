"""The cell: turns committed events into running workers, and nothing else.

It is three parts by role. Its **follower** (:mod:`charter.runner._follow`) reads the
committed entries from its tracked position and decides on each (``policy(entry) →
decision``): a ``SlotAdmitted`` for a worker scheduled on it is a start, a kill or a
revocation folded from the journal (whoever wrote it) is a kill to carry out. Its
**handlers** (:class:`charter.control.WorkerLifecycle`, over ``append_pinned``, and the
budget and admission services) journal each decision; the tracking position commits
with the start it records. Its **driver** (:mod:`charter.runner._driver`) then acts on
what committed (exec, wait, measure, kill) and journals nothing itself. In order, for
each worker that holds a processing slot:

1. lease a warm-pool slot, narrowed to the worker's own lease and grant (caps, wall
   clock up to its expiry, egress allow-list at the cell's egress broker);
2. journal ``SandboxLeased`` (lineage, lease, grant digest), ``WorkerStarted`` and
   ``SandboxStarted`` in one append, pinned to the worker's stream (so it starts at
   most once) and carrying the tracking position (so a replay skips it);
3. exec the worker (only after that commit);
4. on exit, destroy the sandbox, and journal in one append the measured usage charged
   to the lease, the lease returned, ``SandboxExited``, ``WorkerEnded``,
   ``SandboxDiscarded`` and ``SlotReleased`` with the admission of whoever queued next
   (a worker with live descendants journals its exit and usage first, and ends once
   they have).

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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

from charter.app import Charter
from charter.authority import SealedGrant, SpawnIntent
from charter.budgets import CapInputs, ResourceClass
from charter.control import (
    Caller,
    DelegationReplied,
    SpawnResult,
    WorkerLifecycle,
    WorkerScheduled,
    WorkerSpec,
    check_cell_class,
    delegation_stream,
    end_outcome,
)
from charter.control import Outcome as End
from charter.core import BadInputError, Budget, CharterError, Event, now_ms
from charter.ledger import (
    AlreadyTrackedError,
    AppendConflictError,
    AppendFailedError,
    CommitListener,
    Committed,
)
from charter.runner._caps import WorkerCaps, worker_caps
from charter.runner._claim import DEFAULT_CLAIM_S, Claimant
from charter.runner._custody import Custody, custody_seed
from charter.runner._driver import Driver
from charter.runner._filler import PoolFiller
from charter.runner._follow import Follower, Settle, kill_policy, revocation_kills, start_policy
from charter.runner._journal_allowance import JournalAllowance
from charter.runner._kill import kill_uid
from charter.runner._logs import WorkerLogs
from charter.runner._reap import gone_peers, movable
from charter.runner._supervise import Supervisor, load_policy
from charter.runner._verdicts import VerdictActs
from charter.runner._view import WorkerRecord, WorkersView
from charter.runner.errors import (
    CellSupersededError,
    LeaseSpentError,
    NotAWorkerError,
    SecretNotHeldError,
)
from charter.runner.events import (
    CellStarted,
    WorkerKilled,
    WorkerResult,
    WorkerStarted,
    WorkerWaiting,
)
from charter.sandbox import (
    Credentials,
    EgressBroker,
    HostCannotIsolateError,
    KeyBroker,
    Outcome,
    PoolExhaustedError,
    SandboxBudgetError,
    SandboxExited,
    SandboxStarted,
    SandboxUnavailableError,
    Slot,
    UidPoolExhaustedError,
    WarmPool,
    default_state_dir,
    hold_uid,
)
from charter.supervision import SupervisionPolicy

__all__ = ["DEFAULT_CLAIM_S", "Cell", "kill_uid"]

_STDERR_TAIL = 1000  # bytes of a failed worker's stderr kept in its end event
_SETTLE_TRIES = 5  # a failed driver's settlement, each on a fresh read of the journal
_SETTLE_PAUSE_S = 0.2
_DESCENDANTS_WAIT_S = 10.0  # a parent's end waits this long for its killed children
# Listening, the cell also steps this often with no commit announced: a peer's claim
# lapses and a lease expires with nothing committed.
_LISTEN_BACKSTOP_S = 0.25
# What refuses a worker's start (it ends failed_to_start, the cell goes on): its lease
# spent or too small for a sandbox; or no sandbox: every host uid held, a build bwrap
# refused, no room in the pool, a host that stopped isolating.
_NOT_STARTED = (
    LeaseSpentError,
    SandboxBudgetError,
    UidPoolExhaustedError,
    SandboxUnavailableError,
    PoolExhaustedError,
    HostCannotIsolateError,
)
_REASONS: dict[str, str] = {
    # The deadline was journaled with the lease (SandboxLeased.wall_ms).
    "timed_out": "its lease's wall clock or expiry ran out: killed by the sandbox",
    "oom_killed": "its memory cap was reached: killed by its cgroup's OOM killer",
}


class Cell:
    """One cell process: ``open`` (journals the incarnation, recovers), then ``step`` or
    ``run``; ``close`` at the end. What a worker asks through the door
    (:class:`~charter.runner.requests.WorkerRequests`) reaches the cell only through its
    narrow worker-facing methods (``chain``, ``spawn``, ``workers``, ``kill``, ``revoke``,
    ``wait_on_children``, ``resume_processing``, ``holds_processing``,
    ``journal_result``, ``custody_seed``, ``sign``; ``changed`` to wait on), with the
    caller resolved from the sandbox's host uid."""

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
        claim_s: float = DEFAULT_CLAIM_S,
        take_over: bool = False,
        claim_wait_s: float | None = None,
        policy: SupervisionPolicy | None = None,
        supervise: bool = True,
        classes: tuple[str, ...] = (),
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
        self.view = WorkersView()
        app.views.watch(self.view)  # one read of the journal keeps every view current
        self.resources = app.views.resources
        self.budgets = app.budgets()
        self.admission = app.admission()
        self.lifecycle = WorkerLifecycle(app.journal, app.views, self.budgets, self.admission, cell)
        self.claim_s = claim_s  # how long each claim holds; renewed every third of it
        self.take_over = take_over  # fence a live incarnation at once instead of waiting
        self.claim_wait_s = claim_wait_s  # how long to wait for a held claim (None: ever)
        self.fenced: CellSupersededError | None = None  # set once this one is fenced
        # The classes of work it takes, journaled with each incarnation (docs/fabric.md).
        try:
            self.classes = tuple(sorted({check_cell_class(k) for k in classes}))
        except ValueError as e:
            raise BadInputError(f"cell {cell}: {e}") from e
        self.claimant = Claimant(self.lifecycle, self.view, cell, self.classes)
        self.follower = Follower(cell, app.journal, self.view)
        self.tracking = self.follower.tracking
        self.incarnation = 0
        self.driver: Driver | None = None
        self.policy = policy  # None: the Charter home's supervision.json, read at open
        self.supervise = supervise
        self.supervisor: Supervisor | None = None
        self._lock = app.views.lock  # the folds and the process's decisions and appends
        self.custody = Custody(self.keys, self.key_broker)
        self.draining = False  # start nothing more; stop once what runs has finished
        self._stepped = 0  # the views' position the last step decided on
        self._parked_base = 1  # idle sandboxes parked ahead: the processing cap (open)
        self.changed = threading.Condition(self._lock)
        self._listener: CommitListener | None = None  # a PostgreSQL journal's LISTEN
        self._commits = 0  # commits the listener announced (the run loop's wake-ups)
        # Run for each worker recovery fails, before its lease returns (the door settles
        # the model calls a dead incarnation left unsettled: docs/model-door.md).
        self.before_recovered_end: Callable[[str], object] = lambda _lineage: None
        self.verdicts = VerdictActs(
            cell, app.journal, app.views, self.view, self.lifecycle,
            lambda: self.driver, self._kill_one, self._carry_out_kills,
        )  # fmt: skip
        self.journal_allowance = JournalAllowance(
            self, lambda lin, at: self.resources.book.remaining(lin, at).egress_bytes,
            self.lifecycle.record,
        )  # fmt: skip

    @property
    def pool(self) -> WarmPool | None:
        return None if self.driver is None else self.driver.pool

    def host_load(self, cores: int, reserve: int) -> CapInputs:
        """The adaptive cap's inputs, as the composition root takes them."""
        return self.app.host_load(cores, reserve)

    def refresh(self) -> None:
        """Bring every view of the process up to date (hold the lock)."""
        self.app.views.refresh(self.journal)

    def applied(self, committed: tuple[Committed, ...]) -> None:
        self.app.views.applied(committed)

    def _driver(self) -> Driver:
        if self.driver is None:
            raise CharterError("open the cell before following the journal")
        return self.driver

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    # -- life ------------------------------------------------------------------------

    def open(self) -> CellStarted:
        """Journal this incarnation (once the last one's claim lapsed, or at once with
        ``take_over``), recover from the last one, build the pool, start renewing."""
        template = self.template or self._own_template()
        policy = self.policy or load_policy(self.keys.home)  # a bad file: bad input, first
        started = self.claimant.take(
            claim_s=self.claim_s,
            take_over=self.take_over,
            wait_s=self.claim_wait_s,
            stop=lambda: self.draining,
        )
        self.incarnation = started.incarnation
        with self._lock:
            self.refresh()
            state = self.resources.cells.get(self.cell)
            self._recover()
        capacity = self.pool_capacity or (
            state.caps.get(ResourceClass.PROCESSING, 0)
            + state.caps.get(ResourceClass.COORDINATION, 0)
        )
        base = self.state_dir or default_state_dir()
        if self.egress_broker is None:  # every worker's way out: its grant's destinations
            self.egress_broker = EgressBroker(  # and the home's held secrets its grant names
                base / f"egress-{self.cell}-{os.getpid()}.sock",
                credentials=Credentials.from_home(self.app.keys.home),
            )
        # A waiting coordinator keeps its sandbox while it holds a coordination slot
        # instead of a processing one: the pool holds room for both.
        # Idle sandboxes parked ahead of demand: as many as may run at once, plus the
        # workers queued for a slot (see _park_for_demand), never the whole capacity
        # while idle (a waiting coordinator's room is built when it is needed). While
        # workers queue, one more per processing slot may be parked beyond the capacity
        # (``spare``: never leased beyond it), so that when workers end close together
        # each next start finds a sandbox ready, not one to build on the follower.
        self._parked_base = max(1, min(state.caps.get(ResourceClass.PROCESSING, 0), capacity))
        pool = WarmPool(
            template,
            self.budget,
            max(1, capacity),
            parked=self._parked_base,
            spare=self._parked_base,
            # The pool journals only its brokers' events (and the host probe's refusal):
            # each sandbox's lifecycle is the cell's to journal, pinned to its worker.
            sink=self.journal,
            lifecycle=False,
            egress=self.egress_broker,
            keys=self.key_broker,
            state_dir=self.state_dir,
            name=self.cell,
        )
        filler = PoolFiller(pool)
        self.driver = Driver(pool, filler, self.custody, self._lock, WorkerLogs(base))
        if self.supervise:  # one sampler and one canary watch per cell
            self.supervisor = Supervisor(
                self.journal, self._lock, policy, egress=self.egress_broker, held=self.driver.holds
            )
            self.driver.forget = self.supervisor.forget
            self.verdicts.before_digest = self.supervisor.stand_down
            self.verdicts.on_committed = self.supervisor.committed
        filler.start()
        self.claimant.renew_every_third(self.claim_s, self._fence)
        self._listener = self.journal.listen(self._committed)
        return started

    def _fence(self, fenced: CellSupersededError) -> None:
        """This incarnation is fenced: start nothing more, stop answering at the door,
        then kill what it holds (call without holding the views' lock: the door's
        threads may need it to end)."""
        if self.fenced is None:
            self.fenced = fenced  # from here knows_uid says no: the door refuses all
        self._notify()  # a door request waiting on the cell wakes, and is refused
        self._stop_answering()
        if self.driver is not None:
            self.driver.kill_all()
        self._notify()

    def _stop_answering(self) -> None:
        """Once fenced: the door hangs up on every worker before any sandbox is killed."""
        stop = getattr(self.key_broker, "stop_answering", None)
        if stop is not None:
            stop()

    def _own_template(self) -> Path:
        """The workspace every worker starts from: empty but for the door's client
        (``/workspace/charter_door.py``), read-only under each worker's overlay."""
        base = self.state_dir or default_state_dir()
        path = base / f"cell-{self.cell}-template"
        path.mkdir(parents=True, exist_ok=True)
        base.chmod(0o755)
        path.chmod(0o755)
        client = path / "charter_door.py"
        wanted = Path(__file__).with_name("client.py").read_bytes()
        with contextlib.suppress(OSError):
            if client.read_bytes() == wanted:
                return path  # as it is: a running worker of this cell may be reading it
        # Whole or not at all: a worker of another incarnation reading it meanwhile never
        # imports a half-written client.
        partial = path / ".charter_door.py.new"
        partial.write_bytes(wanted)
        partial.chmod(0o644)
        os.replace(partial, client)
        return path

    def close(self) -> None:
        """Kill every live worker of this cell, then stop: the kills are journaled in
        one append and carried out in one pass, and nothing is rebuilt for them (the
        filler stops first)."""
        driver = self.driver
        if driver is not None:
            driver.filler.stop_building()
        self.claimant.stop()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            self.refresh()
            reason = "the cell is shutting down"
            kills = [
                WorkerKilled(lineage=w.lineage, reason=reason)
                for w in self.view.on_cell(self.cell)
                if w.live and w.sandbox_id and w.killed is None and w.exit_code is None
            ]
            if kills and self.fenced is None:
                try:
                    self.lifecycle.record(kills)
                except CellSupersededError as fenced:  # the new holder fails them
                    self.fenced = fenced
        if self.fenced is not None:  # fenced: its door stops answering first
            self._stop_answering()
        # Every sandbox still held here dies with the cell: those just journaled, and
        # those another writer killed or ended (a newer incarnation failed them) whose
        # kill this cell had not carried out yet.
        if driver is not None:
            driver.kill_all()
        if self.fenced is None:
            with contextlib.suppress(CellSupersededError):
                self._carry_out_kills()
        if driver is not None:
            driver.join()
            driver.pool.close()
            driver.filler.stop()
            driver.logs.close()
        if self.supervisor is not None:
            self.supervisor.close()
        if self.fenced is None:  # its claim ends with it: the next one takes it at once
            self.claimant.give_up()
        self.key_broker.close()
        if self.egress_broker is not None:
            self.egress_broker.close()

    def __enter__(self) -> Cell:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recover(self, cell: str | None = None, lifecycle: WorkerLifecycle | None = None) -> None:
        """Fail every worker a previous incarnation of ``cell`` (this one's, or a gone
        peer's this cell reaps through ``lifecycle``) started and did not end: journal
        its kill, then kill what survives of its sandbox, journal its end, return its
        lease and slot. A survivor is killed only under its host uid held here: a uid
        another holder has taken since belongs to that holder's sandbox, never to be
        touched (its processes are not the dead worker's)."""
        cell = cell or self.cell
        lifecycle = lifecycle or self.lifecycle
        failed: list[str] = []
        state = self.state_dir or default_state_dir()
        for w in self.view.on_cell(cell):
            if not (w.live and w.sandbox_id is not None):
                continue
            if cell == self.cell:
                reason = (
                    f"lost with its cell: incarnation {self.incarnation} of cell {cell} "
                    "took over from the one that started it"
                )
            else:
                reason = f"lost with its cell: cell {self.cell} found cell {cell} gone"
            if w.killed is None:  # the kill is journaled before it is done
                lifecycle.record([WorkerKilled(lineage=w.lineage, reason=reason)])
            if w.host_uid is not None:
                held = hold_uid(state, w.host_uid)
                if held is not None:
                    with held:
                        kill_uid(w.host_uid)
            if cell == self.cell:
                self.before_recovered_end(w.lineage)
            if w.exit_code is None:
                self._end(w, "lost", None, reason, discard=True, lifecycle=lifecycle)
            else:  # it had exited; only its teardown was cut short
                outcome, signal = w.exit_outcome()
                self._end(w, outcome, w.exit_code, reason, discard=True, signal=signal,
                          lifecycle=lifecycle)  # fmt: skip
            failed.append(w.lineage)
        for lineage in failed:  # nobody waits for their children any more
            self._kill_descendants(lineage, f"parent {lineage} was lost with its cell")

    def _reap_gone_peers(self) -> None:
        """Reap every peer cell found gone by time with work left (``gone_peers``)."""
        with self._lock:
            at = now_ms()
            gone = gone_peers(self.cell, self.view, at, self.app.views.liveness.live_classes(at))
        for peer in gone:
            self._reap(peer)

    def _movable(self, gone: str) -> Callable[[], list[tuple[WorkerScheduled, int]]]:
        """What of ``gone`` may move, on the views as they stand (``movable``)."""
        live = self.app.views.liveness
        return lambda: movable(gone, self.view, live.live_classes(now_ms()))

    def _reap(self, gone: str) -> None:
        """Take the gone cell over as its reaper (a ``CellStarted`` with ``reaped_by``,
        pinned like any takeover: of several peers racing, one writer wins), move its
        workers that have not started to live cells (:meth:`SpawnService.move_off`),
        fail those it had started, as its own next incarnation would (`_recover`:
        their parents see their ``lost`` ends), and give its claim up at once."""
        reaper = WorkerLifecycle(self.journal, self.app.views, self.budgets, self.admission, gone)
        started = reaper.begin(
            os.getpid(),
            socket.gethostname(),
            claim_ms=int(self.claim_s * 1000),
            last=lambda: self.view.claim(gone),
            reaped_by=self.cell,
        )
        if started is None:  # it renewed, restarted, or another peer reaps it
            return
        try:
            self.app.spawn_service().move_off(gone, self._movable(gone), reaper.pins())
            with self._lock:
                self.refresh()
                self._recover(gone, reaper)
        except CellSupersededError:
            return  # the cell itself came back (or another reaper): it fails them
        except CharterError as error:  # the journal unavailable, races lost: tried again
            print(f"charter cell {self.cell}: reaping {gone}: {error}", file=sys.stderr)
        finally:  # (this peer's next step, once its claim is given up, or another peer)
            reaper.give_up()
        self._notify()

    # -- following -------------------------------------------------------------------

    def step(self) -> int:
        """Act on every processing slot admitted on this cell since the tracked position
        (read once per process: what was passed over is final); return how many
        workers were started. Once this incarnation finds itself fenced it stops
        answering at the door, kills what it holds, and raises
        :class:`CellSupersededError`."""
        try:
            return self._step()
        except CellSupersededError as fenced:
            self._fence(fenced)
            raise

    def _step(self) -> int:
        started = 0
        self._check_not_superseded()
        with self._lock:
            self.refresh()
            self._check_not_superseded()
            self._admit_room()
            self._stepped = self.view.position  # what this step decides on
            admitted = self.follower.admitted()
        self._reap_gone_peers()  # a peer gone by time: its workers failed or moved
        self._carry_out_kills()  # whoever committed them
        self.verdicts.carry_out()  # likewise every committed verdict
        self._park_for_demand()
        if self.draining:
            return 0  # nothing more is started; what runs finishes
        for position, event in admitted:
            with self._lock:
                decision = start_policy(self.cell, event, position, self.view)
            if decision is None:
                continue
            if isinstance(decision, Settle):
                self._settle(decision.lineage, ())
                continue
            outcome = self._start(decision.record, decision.position)
            if outcome is None:  # the journal did not take the start: read it again
                self.follower.reread_from(position)
                break
            started += outcome
        return started

    def _park_for_demand(self) -> None:
        """Park ahead for the workers queued here: the processing cap, plus one for each
        worker waiting for a slot, up to the pool's capacity (an idle cell parks only
        the processing cap); nothing more while sandboxes it killed are still dying (a
        cascade's teardown is not slowed by building their replacements)."""
        if self.driver is None:
            return
        pool = self.driver.pool
        with self._lock:
            state = self.resources.cells.cells().get(self.cell)
            queued = len(state.queued[ResourceClass.PROCESSING]) if state is not None else 0
        want = min(pool.capacity + pool.spare, self._parked_base + queued)
        if self.driver.dying():  # sandboxes it killed are still being torn down: they
            want = min(want, pool.parked)  # have the cores first; parking resumes after
        if want != pool.parked_target:
            pool.parked_target = want
            self.driver.filler.wake()

    def _check_not_superseded(self) -> None:
        """Raise :class:`CellSupersededError` once this incarnation is fenced, or a
        newer one has started (its ``CellStarted`` is in the view): only the newest one
        acts, and only while its claim holds."""
        if self.fenced is not None:
            raise self.fenced
        newest = self.view.incarnations.get(self.cell, 0)
        if self.incarnation and newest > self.incarnation:
            raise CellSupersededError(
                f"cell {self.cell}: incarnation {newest} started, so this one "
                f"({self.incarnation}) stops; its workers were failed by the newer one"
            )

    def _admit_room(self) -> None:
        """Admit queued workers when the cell has room no release will announce (a
        fan-out queued while the host was loaded, or before the cell was configured).
        Only when the views just folded show some queued and room under the cap is it
        decided (on the journal, pinned): a step that finds none reads nothing more."""
        with self._lock:
            if self._room_for_queue() and self.lifecycle.admit_room(self.live):
                self.changed.notify_all()

    def _room_for_queue(self) -> bool:
        """Whether workers queue for a processing slot here with room under the cap for
        at least one, as the views stand (hold the lock)."""
        cells = self.resources.cells
        state = cells.cells().get(self.cell)
        if state is None or not state.caps or not state.queued[ResourceClass.PROCESSING]:
            return False
        cap, _ = cells.cap(
            self.cell, ResourceClass.PROCESSING, self.admission.cap_inputs(self.cell)
        )
        return state.occupancy(ResourceClass.PROCESSING) < cap

    def run(self, until: Callable[[], bool] = lambda: False, poll_s: float = 0.01) -> None:
        """Follow the journal until ``until()`` is true. Between steps it waits only
        while nothing was committed since the last step read the journal: a commit
        this process folded meanwhile (a driver's end admitting the next worker, as
        the step ran) is stepped on at once, not after ``poll_s``.

        On a PostgreSQL journal the cell listens (``Journal.listen``): any writer's
        commit (another cell's, the CLI's) wakes it at once, and it reads the journal
        only then, or every :data:`_LISTEN_BACKSTOP_S` for what time alone changes
        (a peer's claim lapsing, an expiry). On SQLite it polls the head every
        ``poll_s``."""
        while not until():
            commits = self._commits
            if self.step() != 0:
                continue
            if self._listener is not None:
                with self.changed:
                    if self.view.position <= self._stepped and self._commits == commits:
                        self.changed.wait(_LISTEN_BACKSTOP_S)
                continue
            head = self.journal.head()
            with self.changed:
                seen = self._stepped
                if self.view.position <= seen and (head is None or head[0] <= seen):
                    self.changed.wait(poll_s)

    def _committed(self) -> None:
        """A commit to the journal by anyone (the listener's thread): step again."""
        with self.changed:
            self._commits += 1
            self.changed.notify_all()

    def running(self) -> int:
        """How many workers this cell runs now (their sandboxes held here)."""
        return 0 if self.driver is None else self.driver.running()

    def idle(self) -> bool:
        """Nothing of this cell's is running or waiting to run. While the views as they
        stand hold a live worker of its, it is not idle, with no read of the journal
        (checked after every step of ``run_cell --once``): only its own incarnation ends
        its workers (a newer one, or a reaper, fences this one first), and an end it
        journaled is folded as it commits. That look takes no lock (one dict read; a
        count read as it changes is at worst stale, and ``run`` steps again): waiting
        for the views' lock held through a driver's commit delayed the next step."""
        if self.view.live_count.get(self.cell, 0):
            return False
        with self._lock:
            self.refresh()
            return not self.view.live_count.get(self.cell, 0)

    # -- one worker --------------------------------------------------------------------

    def _start(self, w: WorkerRecord, position: int) -> int | None:
        """Start ``w`` (admitted at ``position``): 1 if it started, 0 if not (ended or
        refused), None when the journal did not take the start (read it again)."""
        driver = self._driver()
        refused: Exception | None = None
        # One hold of the lock and one refresh for what the start is decided on: the
        # chain's versions first, then the views (so they cover all those versions do),
        # then its revocation, grant and caps, all read on those views.
        with self._lock:
            # The worker's lineage and every ancestor's: a revocation of any of them
            # lands on that stream, and the start is pinned to them all, so a worker is
            # never started after a revocation above it committed.
            chain = self.lifecycle.chain_versions(w.lineage)
            caller = self.view.delegated_by.get(w.lineage)
            if caller is not None:  # a delegate's lease is its caller's: pinned likewise
                chain |= self.lifecycle.chain_versions(caller)
            revoked = self.lifecycle.revoked_above(w.lineage)  # refreshes the views
            try:  # fail closed: nothing left on its lease, no start; the worker ends
                grant = self._grant(w.lineage)
                caps = self._caps(w.lineage, grant, dry_run=w.scheduled.dry_run)
            except _NOT_STARTED as error:
                refused = error
        if revoked:
            self._carry_out_kills()  # the revocation ends it, journaled, never started
            return 0
        if refused is not None:
            return self._not_started(w, refused)
        try:
            slot = driver.lease(w.lineage, caps.egress, w.scheduled.grant_digest, caps.budget)
        except _NOT_STARTED as error:  # refused for this worker, never the cell's end
            return self._not_started(w, error)
        try:  # its key, and its canaries planted before its first instruction
            self.custody.issue(w.lineage, grant, slot.sandbox_id)
            planted = self._plant(w, slot)
        except CharterError as error:  # fail closed: no key or canary, no start; it ends
            driver.unstarted(w.lineage, slot)
            return self._not_started(w, error, f"no custody key or canaries: {error}")
        return self._commit_start(w, position, chain, slot, planted)

    def _not_started(self, w: WorkerRecord, error: Exception, why: str | None = None) -> int:
        """End ``w`` ``failed_to_start`` for ``error`` (a refusal for this worker, never
        the cell's end), with ``why`` or the refusal's own reason; none started."""
        if why is None:
            why = f"not started: {error}"
            if not isinstance(error, LeaseSpentError | SandboxBudgetError):
                why = f"not started: no sandbox ({type(error).__name__}): {error}"
        self._end(w, "failed_to_start", None, why, discard=False)
        return 0

    def _commit_start(
        self,
        w: WorkerRecord,
        position: int,
        chain: dict[str, int],
        slot: Slot,
        planted: list[Event],
    ) -> int | None:
        """Journal ``w``'s start in ``slot`` (its lease's record, ``planted`` and the
        start, pinned) and, once committed, drive it; as :meth:`_start` returns."""
        driver = self._driver()
        command = w.scheduled.command
        if slot.leased is None:  # the pool made it when it leased the slot
            raise CharterError(f"slot {slot.sandbox_id} was leased without its record")
        events: list[Event] = [
            *planted,
            slot.leased,
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
                # the schedule and nothing since; no revocation above it since; this
                # incarnation still the newest (a superseded one never starts anything)
                took = self.lifecycle.start(
                    w.lineage,
                    events,
                    chain=chain,
                    tracking=(self.tracking, position),
                    version=w.version,
                )
                if took:
                    driver.hold(w.lineage, slot)
        except CellSupersededError:  # nothing starts; step fences this incarnation
            driver.unstarted(w.lineage, slot)
            raise
        except (AppendConflictError, AlreadyTrackedError, AppendFailedError) as error:
            # A stream it was decided on moved (killed, revoked, or only a sibling's
            # fan-out: decided again from this position), already started by another
            # incarnation, or the journal refused the record (tried again): no record,
            # no start.
            driver.unstarted(w.lineage, slot)
            return 0 if isinstance(error, AlreadyTrackedError) else None
        if not took:  # revoked meanwhile: the revocation ends it, never started
            driver.unstarted(w.lineage, slot)
            self._carry_out_kills()
            return 0
        driver.drive(f"worker-{slot.sandbox_id}", lambda: self._drive(w, slot, command))
        return 1

    def _plant(self, w: WorkerRecord, slot: Slot) -> list[Event]:
        """The ``CanariesPlanted`` journaled with ``w``'s start (docs/supervision.md)."""
        if self.supervisor is None:
            return []
        return [self.supervisor.plant(w.lineage, slot, w.scheduled.klass)]

    def _drive(self, w: WorkerRecord, slot: Slot, command: tuple[str, ...]) -> None:
        """The worker's driver thread. Whatever goes wrong on it (an append whose
        outcome is unknown, a refused append, a sandbox that died before it ran) is
        caught and the worker settled: a driver never leaves a slot held or the queue
        stuck."""
        ran: Outcome | None = None
        try:
            ran = self._driver().run(w.lineage, slot, command)
            self._report(w, slot, ran)
        except CellSupersededError as fenced:  # its end is the new holder's to journal
            self._driver().destroy(w.lineage)
            self._fence(fenced)
        except Exception as error:  # noqa: BLE001 - every failure is settled, below
            self._settle_failed_driver(w, error, None if ran is None else (slot, ran))
        finally:  # an ancestor waiting for its end stops waiting for it
            self._driver().reported(w.lineage)
            self._notify()

    def _settle_failed_driver(
        self, w: WorkerRecord, error: Exception, ran: tuple[Slot, Outcome] | None
    ) -> None:
        """The driver of ``w`` failed part-way: its sandbox is destroyed, then whatever
        of its end is not in the journal yet (the end, the lease's return, its slots)
        is settled on the journal as it is read afresh (an append whose outcome was
        unknown may have committed; each retry is pinned to the streams it read, so
        nothing is journaled twice). An exit the driver measured (``ran``) and the
        journal does not hold is journaled with the end, and its usage charged; one
        never measured ends the worker ``lost``. Tried a few times; what still cannot
        be settled is reported on stderr with the worker named, and the cell goes on."""
        self._driver().destroy(w.lineage)
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
                if code is not None:
                    outcome, signal = record.exit_outcome()
                    self._end(record, outcome, code, why, discard=True, signal=signal)
                elif ran is not None:  # measured, not journaled: with the end
                    exited, spent = _measured(*ran)
                    outcome, signal = _outcome(ran[1], record)
                    self._end(record, outcome, exited.exit_code, why, discard=True,
                              signal=signal, exited=(exited,), usage=spent)  # fmt: skip
                else:  # it is not known how it ended: lost with its driver
                    self._end(record, "lost", None, why, discard=True)
            except CellSupersededError as fenced:
                self._fence(fenced)
                return
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

    def _report(self, w: WorkerRecord, slot: Slot, ran: Outcome) -> None:
        """Journal what the driver measured: the answer a worker that never used the
        door printed; then, for a worker with no live descendant (nothing to wait for),
        its sandbox destroyed and, in one append, its exit, the usage charged, its
        lease's return, its end and its slot given back with the next admission. A
        worker with live descendants has its exit and usage journaled first (one
        append), its descendants killed (nobody waits for them now) and waited for (so
        they end first: what they used is charged while their leases are live), then
        its sandbox destroyed and its end journaled."""
        if self.supervisor is not None:  # its last sample; its decoy's watch removed
            self.supervisor.exited(w.lineage)
        exited, spent = _measured(slot, ran)
        with self._lock:
            self.refresh()
            record = self.view.workers[w.lineage]
            waits = bool(self.view.live_descendants(w.lineage))
        if record.result is None and ran.stdout:
            # A worker that never used the door answers with what it printed.
            self.journal_result(w.lineage, ran.stdout)
        if waits:
            self.lifecycle.exit(w.lineage, [exited], spent)
            # Its children die with its interest in them (each kill journaled first),
            # and end before it does: its lease's return ends theirs.
            self._kill_descendants(w.lineage, f"parent {w.lineage} ended")
            self._wait_for_descendants(w.lineage)
        outcome, signal = _outcome(ran, record)
        reason = record.killed or _REASONS.get(outcome, "")
        if signal is not None and outcome == "signalled":
            reason = f"it died of signal {signal}"
        if outcome != "killed" and ran.exit_code != 0 and ran.stderr:
            tail = ran.stderr[-_STDERR_TAIL:].decode("utf-8", "replace")
            reason = f"{reason}; stderr: {tail}" if reason else f"stderr: {tail}"
        if self.supervisor is not None:  # its profile, with how it ended
            self.supervisor.ended(w.lineage, outcome, ran.exit_code)
        # The sandbox is destroyed before its slot is given back: never oversubscribed.
        self._driver().destroy(w.lineage)
        self._end(
            record, outcome, ran.exit_code, reason, discard=True, signal=signal,
            exited=() if waits else (exited,), usage=None if waits else spent,
        )  # fmt: skip

    def _wait_for_descendants(self, lineage: str) -> None:
        """Until no descendant of ``lineage`` that this cell runs is left unended (their
        drivers charge and journal them), at most ``_DESCENDANTS_WAIT_S``."""
        deadline = time.monotonic() + _DESCENDANTS_WAIT_S
        with self.changed:
            while True:
                left = deadline - time.monotonic()
                if not self._unended_descendants(lineage) or left <= 0:
                    return
                self.changed.wait(min(left, 0.05))

    def _unended_descendants(self, lineage: str) -> list[str]:
        """The live descendants of ``lineage`` whose drivers here have not reported:
        held, or with the sandbox destroyed and the end not yet journaled (a parent
        that stopped waiting in between ended first, and its lease's return ended
        theirs: their usage was refused, never charged)."""
        driver = self._driver()
        with self._lock:
            self.refresh()
            return [
                d.lineage
                for d in self.view.live_descendants(lineage)
                if driver.reporting(d.lineage)
            ]

    def _end(
        self,
        w: WorkerRecord,
        outcome: End,
        exit_code: int | None,
        reason: str,
        *,
        discard: bool,
        signal: int | None = None,
        exited: tuple[SandboxExited, ...] = (),
        usage: Budget | None = None,
        lifecycle: WorkerLifecycle | None = None,
    ) -> None:
        """Journal ``w``'s end with its lease's return and its settlement, in one append
        (:meth:`WorkerLifecycle.end`), with its sandbox's ``exited`` and its ``usage``
        charged when they are not journaled yet; never a second end (``lifecycle``: a
        reaped peer's, for its workers)."""
        (lifecycle or self.lifecycle).end(
            lineage=w.lineage,
            sandbox_id=w.sandbox_id,
            outcome=outcome,
            exit_code=exit_code,
            reason=reason,
            signal=signal,
            discarded=(
                self.verdicts.sandbox_end(w.sandbox_id, w.lineage)
                if discard and w.sandbox_id is not None
                else None
            ),
            live=self.live,
            ended=self._ended,
            exited=exited,
            usage=usage,
        )
        self._notify()

    def _ended(self, lineage: str) -> bool:
        """Whether ``lineage``'s end is in the view (hold the lock)."""
        w = self.view.workers.get(lineage)
        return w is not None and w.ended is not None

    def _settle(self, lineage: str, extra: tuple[Event, ...]) -> None:
        """The settlement of ``lineage`` (its slots back, the queue's head admitted),
        appended pinned to the cell's stream."""
        del extra
        self.lifecycle.settle(lineage, self.live)
        self._notify()

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
            self.lifecycle.record([WorkerKilled(lineage=lineage, reason=reason)])
        self._carry_out_kills()

    def _carry_out_kills(self) -> None:
        """Act on every ``WorkerKilled`` and ``LineageRevoked`` folded since the last
        look, whoever appended it (this cell, the CLI, the API, another process).

        A revocation becomes a ``WorkerKilled`` for each live worker of this cell in the
        revoked subtree, journaled (in one append) before any is killed; their sandboxes
        are asked to freeze while it is (a freeze is reversible; the kill is not). Then every kill
        taken from the view is carried out once: the sandboxes of started workers are
        killed together (their drivers then journal their usage and ends, as killed);
        a worker never started is ended at once and never starts. A sandbox is killed
        only while this cell holds its slot (so its host uid is still that sandbox's),
        under the lock that gives slots back."""
        with self._lock:
            implied = revocation_kills(self.cell, self.view)
            freezing = None
            if implied and self.driver is not None:
                # The revocation is committed: its sandboxes are asked to freeze (they
                # can do nothing more) while their kills are journaled; the SIGKILLs
                # wait for that commit.
                freezing = self.driver.freeze(k.lineage for k in implied)
            if implied:
                self.lifecycle.record(implied)
            sandboxes, never_started = kill_policy(self.cell, self.view)
            if sandboxes and self.driver is not None:
                self.driver.kill(sandboxes, freezing)
        for w in never_started:
            self._end(w, "killed", None, w.killed or "killed", discard=False)

    # -- what the door asks for its workers ---------------------------------------------

    def knows_uid(self, host_uid: int) -> bool:
        """Whether ``host_uid`` is the sandbox of a live worker of this cell (called on
        the door's accepting thread: it must not block). Never once fenced: a fenced
        incarnation's door answers nobody."""
        return self.fenced is None and self.driver is not None and self.driver.knows_uid(host_uid)

    def lineage_of(self, host_uid: int) -> str:
        lineage = None if self.driver is None else self.driver.lineage_of(host_uid)
        if lineage is None:
            raise NotAWorkerError("no live worker of this cell runs as this peer")
        return lineage

    def chain(self, lineage: str) -> tuple[SealedGrant, ...]:
        """``lineage``'s journaled grants, from the root down."""
        with self._lock:
            self.refresh()
            return self.view.chain(lineage)

    def spawn(
        self, caller: Caller, intent: SpawnIntent, workers: tuple[WorkerSpec, ...]
    ) -> SpawnResult:
        """A worker's fan-out, through the process's one spawn pipeline (the operator's
        ceilings and gate hold exactly as for ``charter spawn``)."""
        result = self.app.spawn(caller, intent, workers=workers)
        self._notify()
        return result

    def delegate(self, caller: Caller, agent: str, inputs: tuple[str, ...]) -> SpawnResult:
        """A worker's delegation to own-sandbox agent ``agent``, through the process's
        one spawn pipeline (docs/delegation.md); the delegate runs on this cell."""
        result = self.app.delegate(caller, agent, inputs)
        self._notify()
        return result

    def delegated_by(self, lineage: str) -> str | None:
        """The caller ``lineage`` is a delegate of (None: it is no delegate)."""
        with self._lock:
            self.refresh()
            return self.view.delegated_by.get(lineage)

    def delegation_replied(self, caller: str, delegate: str, outcome: str, digest: object) -> None:
        """Journal that ``delegate``'s reply went back to ``caller``: once, pinned to its
        delegation's stream holding just the request (a second reply is refused)."""
        event = DelegationReplied(
            caller=caller,
            delegate=delegate,
            outcome=outcome,
            digest=digest if isinstance(digest, str) else None,
        )
        with self._lock:
            self.journal.append([event], expect={delegation_stream(delegate): 1})

    def revoke(self, lineage: str, reason: str) -> int | None:
        """Revoke ``lineage``'s subtree (a worker's, for its descendant: the caller
        checked that), through the process's one revocation; the follower kills it."""
        position = self.app.revoke(lineage, reason)
        self._notify()
        return position

    def workers(self, lineages: Iterable[str]) -> dict[str, WorkerRecord | None]:
        """Each of ``lineages``' records as the journal stands now (None: nothing
        scheduled for it), read in one refresh."""
        with self._lock:
            self.refresh()
            return {x: self.view.workers.get(x) for x in lineages}

    def wait_on_children(self, lineage: str, waiting: WorkerWaiting) -> None:
        """Journal ``waiting`` with the swap of ``lineage``'s processing slot for a
        coordination slot (refused, journaled, when the coordination class is full)."""
        with self._lock:
            self.admission.wait_on_children(self.cell, lineage, waiting, self.live)
        self._notify()

    def resume_processing(self, lineage: str) -> None:
        """Give back ``lineage``'s coordination slot and take (or queue for) a
        processing one."""
        with self._lock:
            self.admission.resume_processing(self.cell, lineage)
        self._notify()

    def holds_processing(self, lineage: str) -> bool:
        """Whether ``lineage`` holds a processing slot, as the journal stands now."""
        with self._lock:
            self.refresh()
            holders = self.resources.cells.get(self.cell).holders[ResourceClass.PROCESSING]
            return lineage in holders

    def journal_result(self, lineage: str, data: bytes) -> str:
        """Journal ``lineage``'s answer: one per worker, charged to its journal allowance
        first (``_journal_allowance``), refused if it gave one already."""
        return self.journal_allowance.journal_result(lineage, data, self._result_of)

    def _result_of(self, lineage: str) -> WorkerResult | None:
        w = self.view.workers.get(lineage)
        return None if w is None else w.result

    def door_call(self, lineage: str, method: str, size: int) -> None:
        """Count a door call of ``lineage`` for its supervision (``size``: a spawn's
        width, a result's bytes)."""
        if self.supervisor is not None:
            self.supervisor.door_call(lineage, method, size)

    def secret(self, lineage: str, name: str) -> NoReturn:
        """The secret ``name`` for ``lineage``: Charter holds none for workers yet, so
        every name is refused; its sandbox's decoy name is a canary touch first."""
        if self.supervisor is not None:
            self.supervisor.secret_asked(lineage, name)
        raise SecretNotHeldError(f"{lineage}'s grant holds no secret named {name!r}")

    def sign(self, lineage: str, tag: str, message: bytes) -> bytes:
        """Sign for ``lineage`` with the key issued to its sandbox (and only that one)."""
        slot = None if self.driver is None else self.driver.slot(lineage)
        if slot is None:
            raise NotAWorkerError(f"{lineage} holds no key here")
        return self.custody.sign(lineage, tag, message, slot.sandbox_id)

    # -- caps --------------------------------------------------------------------------

    def _grant(self, lineage: str) -> SealedGrant:
        """``lineage``'s committed grant, parsed (a start parses it once, for the caps
        and the custody key: each parse validates the whole grant), as the views stand
        (hold the lock; the start refreshed them)."""
        minted = self.view.grants.get(lineage)
        if minted is None:
            raise LeaseSpentError(f"{lineage} has no committed grant")
        return minted.sealed()

    def _caps(self, lineage: str, grant: SealedGrant, *, dry_run: bool = False) -> WorkerCaps:
        """The sandbox caps of ``lineage``: its lease and ``grant`` as committed, now
        (``dry_run``: a test run's, every held credential withheld), as the views stand
        (hold the lock; the start refreshed them)."""
        book = self.resources.book
        at = now_ms()
        return worker_caps(
            self.budget,
            book.remaining(lineage, at),
            book.deadline(lineage),
            grant.grant.terms,
            at,
            withhold_credentials=dry_run,
        )

    def custody_seed(self, lineage: str) -> bytes:
        """``lineage``'s custody seed (its committed grant's subject key, or refused)."""
        with self._lock:
            minted = self.view.grants.get(lineage)
        return custody_seed(self.keys, lineage, None if minted is None else minted.sealed())


def _measured(slot: Slot, ran: Outcome) -> tuple[SandboxExited, Budget]:
    """What the driver measured of ``slot``'s run: its exit, and the usage to charge."""
    usage = ran.usage
    exited = SandboxExited(
        sandbox_id=slot.sandbox_id, exit_code=ran.exit_code, how=ran.how, usage=usage
    )
    spent = Budget(
        tokens=0,
        wall_ms=usage.wall_ms,
        cpu_ms=usage.cpu_ms,
        mem_bytes=usage.memory_peak_bytes,
        egress_bytes=usage.egress_bytes,
    )
    return exited, spent


def _outcome(ran: Outcome, record: WorkerRecord) -> tuple[End, int | None]:
    """How a worker that ran ended (and its signal): what its sandbox measured, and
    whether a kill of it had committed when its record was read."""
    return end_outcome(
        how=ran.how,
        exit_code=ran.exit_code,
        oom_kills=ran.usage.oom_kills,
        killed=record.killed is not None,
    )
