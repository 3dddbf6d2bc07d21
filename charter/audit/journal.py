"""Chain verification of a whole journal, in parallel chunks on every core.

The walk itself is :func:`charter.audit.chain.audit_chain` (pure, no database driver);
this module opens a connection per worker process, so it lives apart from it.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any

from charter.audit.chain import ChainHead, ChainReport, audit_chain, finish_report
from charter.ledger import Journal, Location

__all__ = ["audit_journal"]


PARALLEL_MIN = 200_000  # below this, worker start-up costs more than it saves
CHUNK = 100_000


def _audit_range(location: Location, bounds: tuple[int, int]) -> ChainReport:
    """One chunk, in a worker process: its own connection, its predecessor looked up."""
    store = Journal.open_chain(location)
    try:
        return audit_chain(store, start=bounds[0], stop=bounds[1])
    finally:
        store.close()


def audit_journal(
    journal: Any,
    *,
    start: int | None = None,
    stop: int | None = None,
    expect_head: ChainHead | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
    chunk: int = CHUNK,
    parallel_min: int = PARALLEL_MIN,
) -> ChainReport:
    """:func:`audit_chain` over a :class:`~charter.ledger.journal.Journal`, in parallel
    chunks on every core when the range is long. ``progress(done, total)`` is called as
    entries of the range are checked.

    Each entry's check needs only its own row and its predecessor's stored hash, so
    chunks verify independently; they are taken in order and the first failing chunk
    names the first bad position, as a single walk would.
    """
    head = journal.head()
    last = head[0] if head else 0
    lo, hi = start or 1, min(stop or last, last)
    total = max(0, hi - lo + 1)
    tick = None if progress is None else partial(_report_progress, progress, total)
    workers = workers or os.cpu_count() or 1
    if workers < 2 or total < parallel_min:
        return audit_chain(journal, start=start, stop=stop, expect_head=expect_head, progress=tick)
    chunks = [(a, min(a + chunk - 1, hi)) for a in range(lo, hi + 1, chunk)]
    checked = 0
    tip: ChainHead | None = None
    # spawn, not fork: the parent may hold database connections a fork would share. An
    # executor, not a Pool: a worker that dies (killed, out of memory) breaks it with an
    # error instead of leaving the walk waiting forever; the walk then runs here.
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=context) as pool:
            for report in pool.map(partial(_audit_range, journal.location), chunks):
                if not report.ok:
                    return report.model_copy(
                        update={"checked": checked + report.checked, "head": report.head or tip}
                    )
                checked += report.checked
                tip = report.head or tip
                if tick is not None:
                    tick(checked)
    except BrokenProcessPool:
        return audit_chain(journal, start=start, stop=stop, expect_head=expect_head, progress=tick)
    return finish_report(journal, checked, tip, expect_head)


def _report_progress(progress: Callable[[int, int], None], total: int, done: int) -> None:
    progress(done, total)
