"""The cell's pool filler: long-lived threads that park warm slots ahead of demand.

A slot's bwrap dies with the thread that built it (``--die-with-parent`` is per
thread), so slots cannot be refilled on the short-lived threads that drive workers; and
building them on the thread that follows the journal would put every build (tens of
milliseconds) on the path from a committed schedule to its exec. These threads build
instead, whenever they are woken (at open, and after each slot is given back), up to the
pool's capacity: the follower then leases a parked slot, and builds only when none is
ready.

There is one builder per core, up to the pool's capacity: a build is mostly the
kernel's and bwrap's work, so two overlap on two cores, and with one builder the
follower kept finding nothing parked when two workers ended close together (a quarter
of the starts of a 200-worker run built cold, on the follower). The pool reserves each
build's capacity under its lock, so builders never hold more than the capacity."""

from __future__ import annotations

import contextlib
import os
import threading

from charter.sandbox import WarmPool

__all__ = ["PoolFiller"]


class PoolFiller:
    """Keeps ``pool`` filled from threads of its own until :meth:`stop`."""

    def __init__(self, pool: WarmPool) -> None:
        self.pool = pool
        builders = max(1, min(pool.capacity, os.cpu_count() or 1))
        self._wanted = [threading.Event() for _ in range(builders)]  # one per builder
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._run, args=(w,), name=f"fill-{pool.name}", daemon=True)
            for w in self._wanted
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        self.wake()

    def wake(self) -> None:
        """A slot was given back (or the pool is new): build up to capacity again."""
        for wanted in self._wanted:
            wanted.set()

    def stop_building(self) -> None:
        """Build nothing more (the cell is closing: what it kills is not replaced)."""
        self._stopped = True

    def stop(self) -> None:
        """Stop after the builds in progress (close the pool first: its fill returns)."""
        self._stopped = True
        self.wake()
        for thread in self._threads:
            thread.join(timeout=30)

    def _run(self, wanted: threading.Event) -> None:
        while True:
            wanted.wait()
            wanted.clear()
            if self._stopped:
                return
            # A failed build is the follower's to meet: leasing builds cold when nothing
            # is parked and raises the build's error there, where it is journaled and
            # the worker ends. This thread only gets ahead of demand: it waits for the
            # next wake.
            with contextlib.suppress(Exception):
                self.pool.fill()
