"""The pool filler builds on long-lived threads of its own, in parallel up to one per
core and never more than the pool's capacity, each time it is woken, and stops."""

from __future__ import annotations

import os
import threading
import time
from typing import cast

import pytest

from charter.runner._filler import PoolFiller
from charter.sandbox import WarmPool


class _Pool:
    """A stand-in for WarmPool's fill: each call builds one slot slowly, reserving it
    under a lock as the pool does, and records how many builds overlapped on which
    threads."""

    def __init__(self, capacity: int) -> None:
        self.name = "test"
        self.capacity = capacity
        self.held = 0
        self.building = 0
        self.most_at_once = 0
        self.threads: set[int] = set()
        self._lock = threading.Lock()

    def fill(self) -> None:
        while True:
            with self._lock:
                if self.held >= self.capacity:
                    return
                self.held += 1
                self.building += 1
                self.most_at_once = max(self.most_at_once, self.building)
                self.threads.add(threading.get_ident())
            time.sleep(0.05)
            with self._lock:
                self.building -= 1

    def give_back(self, n: int) -> None:
        with self._lock:
            self.held -= n


def _settled(pool: _Pool) -> None:
    deadline = time.monotonic() + 10
    while (pool.held < pool.capacity or pool.building) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.held == pool.capacity
    assert pool.building == 0


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to build two at once")
def test_builds_overlap_up_to_the_capacity_on_long_lived_threads() -> None:
    pool = _Pool(capacity=2)
    filler = PoolFiller(cast(WarmPool, pool))
    filler.start()
    try:
        _settled(pool)
        assert pool.most_at_once == 2  # two builds at once, not one after the other
        first = set(pool.threads)
        pool.give_back(2)
        filler.wake()
        _settled(pool)
        assert pool.threads == first  # the same threads again: slots outlive no builder
    finally:
        filler.stop()
    assert not any(t.is_alive() for t in filler._threads)


def test_one_builder_for_a_pool_of_one() -> None:
    pool = _Pool(capacity=1)
    filler = PoolFiller(cast(WarmPool, pool))
    filler.start()
    try:
        _settled(pool)
        assert pool.most_at_once == 1
        assert len(filler._threads) == 1
    finally:
        filler.stop()
