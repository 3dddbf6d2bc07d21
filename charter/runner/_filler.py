"""The cell's pool filler: one long-lived thread that parks warm slots ahead of demand.

A slot's bwrap dies with the thread that built it (``--die-with-parent`` is per
thread), so slots cannot be refilled on the short-lived threads that drive workers; and
building them on the thread that follows the journal would put every build (tens of
milliseconds) on the path from a committed schedule to its exec. This thread builds
instead, whenever it is woken (at open, and after each slot is given back), up to the
pool's capacity: the follower then leases a parked slot, and builds only when none is
ready."""

from __future__ import annotations

import contextlib
import threading

from charter.sandbox import WarmPool

__all__ = ["PoolFiller"]


class PoolFiller:
    """Keeps ``pool`` filled from one thread of its own until :meth:`stop`."""

    def __init__(self, pool: WarmPool) -> None:
        self.pool = pool
        self._wanted = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"fill-{pool.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self.wake()

    def wake(self) -> None:
        """A slot was given back (or the pool is new): build up to capacity again."""
        self._wanted.set()

    def stop(self) -> None:
        """Stop after the build in progress (close the pool first: its fill returns)."""
        self._stopped = True
        self._wanted.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stopped:
                return
            # A failed build is the follower's to meet: leasing builds cold when nothing
            # is parked and raises the build's error there, where it is journaled and
            # the worker ends. This thread only gets ahead of demand: it waits for the
            # next wake.
            with contextlib.suppress(Exception):
                self.pool.fill()
