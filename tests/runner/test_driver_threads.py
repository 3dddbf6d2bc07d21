"""The driver's threads are kept and reused: a worker handed over while a driver thread
is idle runs on it (no thread started on the follower's path), every worker handed
over runs at once however many run already, and ``join`` waits for all of them, then
lets the idle threads end."""

from __future__ import annotations

import functools
import threading
from typing import Any

from charter.runner._driver import Driver


def _driver() -> Driver:
    # drive and join touch none of the sandboxes' parts
    none: Any = None
    return Driver(none, none, none, threading.RLock(), none)


def _idle(driver: Driver) -> int:
    with driver._drivers:
        return driver._idle


def test_a_worker_handed_over_while_a_thread_idles_runs_on_it() -> None:
    driver = _driver()
    ran: list[int] = []
    driver.drive("worker-a", lambda: ran.append(threading.get_ident()))
    waited = threading.Event()
    for _ in range(500):  # until its thread waits for the next worker
        if _idle(driver) == 1:
            break
        waited.wait(0.01)
    assert _idle(driver) == 1
    done = threading.Event()

    def second() -> None:
        ran.append(threading.get_ident())
        done.set()

    driver.drive("worker-b", second)
    assert done.wait(5)
    driver.join()
    assert len(ran) == 2
    assert ran[0] == ran[1]  # the same thread drove both


def test_every_worker_runs_at_once_and_join_waits_for_them() -> None:
    driver = _driver()
    release = threading.Event()
    running = threading.Semaphore(0)
    ended: list[str] = []

    def worker(name: str) -> None:
        running.release()
        release.wait(10)
        ended.append(name)

    for i in range(5):  # five held at once: each on a thread of its own
        driver.drive(f"worker-{i}", functools.partial(worker, str(i)))
    for _ in range(5):
        assert running.acquire(timeout=5)
    threading.Timer(0.2, release.set).start()
    driver.join(timeout_s=10)
    assert sorted(ended) == [str(i) for i in range(5)]


def test_join_gives_up_after_its_timeout() -> None:
    driver = _driver()
    release = threading.Event()

    def stuck() -> None:
        release.wait(10)

    driver.drive("worker-stuck", stuck)
    driver.join(timeout_s=0.1)  # returns with the worker still running
    release.set()
