"""The cell's driver: the sandboxes it holds, and each worker's exec, wait and
measurement. It journals nothing: the cell journals what it decided before the driver
acts (the start, each kill) and what the driver measured after (the exit, the end).

A sandbox is held from the moment its worker's start committed until it is destroyed;
its host uid is that sandbox's for as long as it is held, so a kill by uid is sent only
to sandboxes held here, under the lock that gives them back.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from charter.core import Budget
from charter.runner._custody import Custody
from charter.runner._filler import PoolFiller
from charter.runner._kill import Freezing, freeze_then_kill
from charter.runner._logs import WorkerLogs
from charter.runner.events import RESULT_CAP
from charter.sandbox import EgressGrant, Outcome, SandboxControl, Slot, WarmPool

__all__ = ["Driver"]

_IDLE_S = 5.0  # a driver thread with no worker to drive for this long ends


class Driver:
    """The sandboxes of one cell process, by lineage and by host uid."""

    def __init__(
        self,
        pool: WarmPool,
        filler: PoolFiller,
        custody: Custody,
        lock: threading.RLock,
        logs: WorkerLogs,
    ) -> None:
        self.pool = pool
        self.filler = filler
        self.custody = custody
        self.logs = logs
        self.lock = lock  # the views' lock: a kill and a give-back never interleave
        self._slots: dict[str, Slot] = {}  # lineage -> its leased slot
        self._by_uid: dict[int, str] = {}  # sandbox host uid -> lineage
        # Driver threads are kept and reused: a thread started for each worker made
        # the follower wait, per start, for the new thread to be scheduled (under the
        # GIL's contention, a switch interval or more) before it could decide the next.
        self._tasks: deque[tuple[str, Callable[[], None]]] = deque()
        self._drivers = threading.Condition(threading.Lock())
        self._idle = 0  # driver threads waiting for a worker
        self._busy = 0  # workers handed to a driver thread and not finished
        self._closed = False
        self.forget: Callable[[str], None] = lambda lineage: None  # a start that never was
        self._quarantined: dict[str, str] = {}  # lineage -> why its sandbox is withheld
        self._dying: set[str] = set()  # killed here, their sandboxes not destroyed yet
        # Started here, their drivers' reports not over: a sandbox is destroyed before
        # its worker's end is journaled, so not held is not yet ended.
        self._reporting: set[str] = set()

    # -- sandboxes -------------------------------------------------------------------

    def lease(self, lineage: str, egress: EgressGrant, grant_digest: str, budget: Budget) -> Slot:
        """A warm sandbox for ``lineage``, narrowed to ``budget`` and ``egress``."""
        return self.pool.lease(
            egress, timeout=60.0, lineage=lineage, grant_digest=grant_digest, budget=budget
        )

    def hold(self, lineage: str, slot: Slot) -> None:
        """``lineage``'s start committed: its sandbox is held here until destroyed."""
        with self.lock:
            self._slots[lineage] = slot
            self._by_uid[slot.host_uid] = lineage
            self._reporting.add(lineage)

    def holds(self, lineage: str) -> bool:
        with self.lock:
            return lineage in self._slots

    def reporting(self, lineage: str) -> bool:
        """Whether ``lineage`` was started here and its driver has not finished its
        report: held, or destroyed with its end not journaled yet."""
        with self.lock:
            return lineage in self._reporting

    def reported(self, lineage: str) -> None:
        """``lineage``'s driver is done: its end journaled (or given up on)."""
        with self.lock:
            self._reporting.discard(lineage)

    def slot(self, lineage: str) -> Slot | None:
        with self.lock:
            return self._slots.get(lineage)

    def knows_uid(self, host_uid: int) -> bool:
        """Whether ``host_uid`` is a sandbox held here (lock-free: the door's accepting
        thread must not block)."""
        return host_uid in self._by_uid

    def lineage_of(self, host_uid: int) -> str | None:
        with self.lock:
            return self._by_uid.get(host_uid)

    def running(self) -> int:
        with self.lock:
            return len(self._slots)

    def dying(self) -> int:
        """Sandboxes killed here whose teardown has not finished (the cell parks nothing
        more meanwhile: the host's cores go to their teardown first)."""
        with self.lock:
            return len(self._dying)

    def give_back(self, slot: Slot, quarantined: str | None = None) -> None:
        """Discard a leased slot (never re-parked: a sandbox runs one worker), or
        destroy it as quarantined, and have the filler build its replacement off the
        follower's path."""
        if quarantined is None:
            self.pool.release(slot, refill=False)
        else:
            self.pool.quarantine(slot, quarantined, refill=False)
        self.filler.wake()

    def quarantine(self, lineage: str, reason: str) -> None:
        """``lineage``'s sandbox is quarantined: destroyed as such when it is destroyed."""
        with self.lock:
            self._quarantined[lineage] = reason

    def unstarted(self, lineage: str, slot: Slot) -> None:
        """A slot leased for a start that did not commit: its key and the slot go back."""
        self.custody.release(lineage)
        self.forget(lineage)
        self.give_back(slot)

    def destroy(self, lineage: str) -> None:
        """Stop holding ``lineage``'s sandbox and destroy it (a no-op when not held)."""
        with self.lock:
            slot = self._slots.pop(lineage, None)
            if slot is not None:
                self._by_uid.pop(slot.host_uid, None)
            quarantined = self._quarantined.pop(lineage, None)
            # A kill marks only a sandbox held here as dying: once it is not held, none
            # marks it, so one not dying now needs the lock no more (the lock is the
            # views': taken again here, the teardown waited for another thread's commit).
            dying = lineage in self._dying
        self.custody.release(lineage)
        if slot is not None:
            self.give_back(slot, quarantined)
        if dying:
            with self.lock:
                self._dying.discard(lineage)

    # -- kills -----------------------------------------------------------------------

    def freeze(self, lineages: Iterable[str]) -> Freezing:
        """Ask the held sandboxes of ``lineages`` to freeze, on threads of their own,
        and return at once; a later :meth:`kill` of them waits for the asks instead of
        asking again (a revocation freezes its subtree while its kills are journaled)."""
        with self.lock:
            held = [self._slots[x] for x in set(lineages) if x in self._slots]
        return Freezing([SandboxControl(slot.spec) for slot in held])

    def kill(self, lineages: Iterable[str], freezing: Freezing | None = None) -> None:
        """Freeze, then SIGKILL, the held sandboxes of ``lineages``, all together
        (:func:`freeze_then_kill`; their drivers then measure and report); a lineage
        not held here is not touched. ``freezing``: asked by :meth:`freeze` already."""
        with self.lock:
            held = [x for x in set(lineages) if x in self._slots]
            self._dying.update(held)
            self._kill([self._slots[x] for x in held], freezing)

    def kill_all(self) -> None:
        """Freeze, then SIGKILL, every sandbox held here, all together."""
        with self.lock:
            self._dying.update(self._slots)
            self._kill(list(self._slots.values()))

    def _kill(self, slots: list[Slot], freezing: Freezing | None = None) -> None:
        if slots:
            controls = [SandboxControl(slot.spec) for slot in slots]
            freeze_then_kill(controls, {slot.host_uid for slot in slots}, freezing)

    # -- exec ------------------------------------------------------------------------

    def drive(self, name: str, target: Callable[[], None]) -> None:
        """Run ``target`` (a worker's exec, wait and report) on a driver thread: an idle
        one if there is one, else a new one (so every worker runs at once)."""
        with self._drivers:
            self._tasks.append((name, target))
            self._busy += 1
            if self._idle > 0:
                self._idle -= 1  # it is taken: a second drive meanwhile starts another
                self._drivers.notify()
                return
        threading.Thread(target=self._serve, name=name).start()

    def _serve(self) -> None:
        """A driver thread: drive workers as they come, end once idle for ``_IDLE_S``
        (or at :meth:`join`)."""
        while True:
            with self._drivers:
                if not self._tasks:
                    self._idle += 1
                    deadline = time.monotonic() + _IDLE_S
                    while not self._tasks and not self._closed:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._drivers.wait(left)
                    if not self._tasks:  # idle too long, or joined: this thread ends
                        self._idle -= 1
                        return
                name, target = self._tasks.popleft()
            threading.current_thread().name = name
            try:
                target()
            finally:
                with self._drivers:
                    self._busy -= 1
                    self._drivers.notify_all()

    def run(self, lineage: str, slot: Slot, command: tuple[str, ...]) -> Outcome:
        """Exec ``command`` in ``slot`` (its start is committed), wait, and measure: the
        exit, how it ended, cgroup usage and the captured output (its live tail copied
        to ``lineage``'s log files meanwhile, set up here on the driver's thread, off the
        follower's path)."""
        self.logs.track(lineage, slot)
        try:
            return slot.run(list(command), capture=True, max_output_bytes=RESULT_CAP)
        finally:
            self.logs.finish(lineage)

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait (at most ``timeout_s``) for every worker handed to a driver thread to be
        driven to its end, then let the idle driver threads end."""
        deadline = time.monotonic() + timeout_s
        with self._drivers:
            while self._busy > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._drivers.wait(left)
            self._closed = True
            self._drivers.notify_all()
