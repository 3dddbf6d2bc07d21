"""The commit window, injected: the real chained recorders, holding a batch's
transaction open for a while after its commit time was stamped under the write lock
(a slow fsync, a large group commit, a stalled leader). Test-side only: a journal uses
them when opened with :func:`env` (the eventsourcing recorder topic).

What is held, how long and how often is set per process with :func:`configure` (the
in-process tests) or from the environment (:func:`configure_from_environ`, the mixed
load's worker processes). Each hold is logged before it starts (one line appended to
``log``, which survives a SIGKILL), and ``<holding>/<pid>`` exists while the hold lasts,
so a supervisor can kill a process inside the held write lock.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from charter.budgets import LeaseBook, LedgerState
from charter.ledger import ChainedPostgresProcessRecorder, ChainedSQLiteProcessRecorder

KINDS = ("UsageRecorded", "LeaseReleased", "LeaseRenewed", "LeaseGranted")
"""The append kinds a budget decision makes (usage, release, renewal, fan-out)."""


@dataclass
class Hold:
    kinds: frozenset[str] = frozenset()
    seconds: tuple[float, float] = (0.0, 0.0)
    chance: float = 1.0
    log: Path | None = None
    holding: Path | None = None
    rng: random.Random = field(default_factory=random.Random)


_hold = [Hold()]  # the one in force (a list, so configure replaces it in place)
held = threading.Event()
"""Set when a hold starts (its batch is stamped and not committed): in-process tests
wait on it rather than on a clock."""


def configure(
    kinds: Sequence[str],
    seconds: float | tuple[float, float],
    *,
    chance: float = 1.0,
    log: Path | None = None,
    holding: Path | None = None,
    seed: int | None = None,
) -> None:
    """Hold every batch holding an event of ``kinds`` (with probability ``chance``)
    for ``seconds`` (or a uniform draw from a range) after its stamp."""
    span = (seconds, seconds) if isinstance(seconds, int | float) else seconds
    _hold[0] = Hold(frozenset(kinds), span, chance, log, holding, random.Random(seed))
    held.clear()


def configure_from_environ() -> None:
    """``CHARTER_HOLD_KINDS`` (comma-separated type names), ``CHARTER_HOLD_S``
    ("lo,hi" seconds), ``CHARTER_HOLD_CHANCE``, ``CHARTER_HOLD_LOG``,
    ``CHARTER_HOLD_DIR`` (where ``<pid>`` marks a hold in progress)."""
    kinds = [k for k in os.environ.get("CHARTER_HOLD_KINDS", "").split(",") if k]
    lo, hi = (float(x) for x in os.environ.get("CHARTER_HOLD_S", "0,0").split(","))
    log, holding = os.environ.get("CHARTER_HOLD_LOG"), os.environ.get("CHARTER_HOLD_DIR")
    configure(
        kinds,
        (lo, hi),
        chance=float(os.environ.get("CHARTER_HOLD_CHANCE", "1")),
        log=Path(log) if log else None,
        holding=Path(holding) if holding else None,
    )


def environ(
    kinds: Sequence[str], seconds: tuple[float, float], chance: float, log: Path, holding: Path
) -> dict[str, str]:
    """The environment :func:`configure_from_environ` reads."""
    return {
        "CHARTER_HOLD_KINDS": ",".join(kinds),
        "CHARTER_HOLD_S": f"{seconds[0]},{seconds[1]}",
        "CHARTER_HOLD_CHANCE": str(chance),
        "CHARTER_HOLD_LOG": str(log),
        "CHARTER_HOLD_DIR": str(holding),
    }


def env(url: str) -> dict[str, str]:
    """The settings that make ``Journal.open(url, env=…)`` use a holding recorder."""
    name = "HoldingSQLite" if url.startswith("sqlite") else "HoldingPostgres"
    return {"APPLICATION_RECORDER_TOPIC": f"tests.budgets._slow:{name}"}


def _maybe_hold(stored_events: Any) -> None:
    hold = _hold[0]
    kinds = {s.topic.partition("/")[0] for s in stored_events} & hold.kinds
    if not kinds or hold.rng.random() >= hold.chance:
        return
    seconds = hold.rng.uniform(*hold.seconds)
    if hold.log is not None:
        with hold.log.open("a") as log:
            log.write(f"{os.getpid()} {','.join(sorted(kinds))} {seconds:.3f}\n")
    mark = hold.holding / str(os.getpid()) if hold.holding is not None else None
    if mark is not None:
        mark.touch()
    held.set()
    try:
        time.sleep(seconds)
    finally:
        if mark is not None:
            mark.unlink(missing_ok=True)


def nothing_unsettled(
    self: LeaseBook, ledger: LedgerState, settled_ms: int
) -> tuple[int, int, int, int, int]:
    """``LeaseBook._unsettled`` switched off: every expiry is final at once (the book
    as it was before settled time), for the controls and the benchmarks' "without"."""
    del self, ledger, settled_ms
    return (0, 0, 0, 0, 0)


@contextmanager
def settled_time_off() -> Iterator[None]:
    """The settled-time rule switched off while the block runs (test and bench side)."""
    rule = LeaseBook._unsettled
    LeaseBook._unsettled = nothing_unsettled  # type: ignore[method-assign]
    try:
        yield
    finally:
        LeaseBook._unsettled = rule  # type: ignore[method-assign]


class HoldingSQLite(ChainedSQLiteProcessRecorder):
    """The real recorder; a held batch's transaction stays open after its stamp."""

    def _insert_events(self, c: Any, stored_events: Any, **kwargs: Any) -> Any:
        result = super()._insert_events(c, stored_events, **kwargs)
        _maybe_hold(stored_events)
        return result


class HoldingPostgres(ChainedPostgresProcessRecorder):
    """The real recorder; a held batch's transaction stays open after its stamp (every
    budget decision's batch is stamped under the table lock: it has a deadline or
    pinned streams)."""

    def _insert_stored_events(self, curs: Any, stored_events: Any, **kwargs: Any) -> Any:
        result = super()._insert_stored_events(curs, stored_events, **kwargs)
        _maybe_hold(stored_events)
        return result
