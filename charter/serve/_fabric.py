"""What the page shows, read from the journal: the projections as of a position
(tree, budgets, slots and the cells' liveness), the recent refusals and verdicts, and
the budgets' burn-down over positions.

One :class:`Fabric` owns the journal (opened read-only) and its projector; every call
runs on the one thread that opened them (SQLite connections are bound to theirs):
the web face calls it through :meth:`Fabric.call`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import charter.catalogue  # noqa: F401 (every event type decodes)
from charter.app import Journal, read_journal
from charter.core.text import shown
from charter.projections import BudgetReport, Projector

__all__ = ["NOTABLE", "Fabric"]

T = TypeVar("T")

# The events the page lists as "recent refusals and verdicts" (and how workers ended).
NOTABLE = (
    "SpawnRefused",
    "BudgetRefused",
    "AdmissionRefused",
    "ModelCallRefused",
    "GateDecided",
    "ThrottleVerdict",
    "PauseVerdict",
    "ResumeVerdict",
    "KillVerdict",
    "QuarantineVerdict",
    "LineageRevoked",
    "WorkerKilled",
    "WorkerResult",
    "WorkerEnded",
)
# The verdicts the tree shows on the lineage they name (the newest one), by their word.
_VERDICTS = {
    "ThrottleVerdict": "throttled",
    "PauseVerdict": "paused",
    "ResumeVerdict": "resumed",
    "KillVerdict": "killed",
    "QuarantineVerdict": "quarantined",
    "LineageRevoked": "revoked",
}
_KEPT = 5_000  # notable events kept in memory (the newest)
_LISTED = 60  # of which a fabric lists the newest before its position
_TEXT = 300  # characters of any worker-controlled text shown
_SAMPLES = 24  # burn-down points read from the history when the page starts
_SERIES = 400  # burn-down points kept (halved, evenly, when it grows past)
_FIELDS = (
    "actor", "lineage", "cell", "fanout", "reason", "message", "objective", "verdict",
    "width", "operation", "resource", "cap", "occupancy", "outcome", "exit_code", "text",
    "policy", "quota_permille",
)  # fmt: skip


def _notable(position: int, recorded_at: object, type_name: str, event: Any) -> dict[str, Any]:
    data = event.model_dump(mode="json")
    out: dict[str, Any] = {"position": position, "type": type_name, "at": str(recorded_at)}
    for name in _FIELDS:
        value = data.get(name)
        if value is None:
            continue
        out[name] = shown(value, _TEXT) if isinstance(value, str) else value
    evidence = data.get("evidence")
    if evidence:
        out["signal"] = shown(evidence[0].get("signal"), _TEXT)
    return out


def _burn_point(position: int, at_ms: int, ledgers: list[dict[str, Any]]) -> dict[str, Any]:
    """Each root ledger's allocation and remaining at one position."""
    roots = {
        line["lineage"]: {"allocation": line["allocation"], "remaining": line["remaining"]}
        for line in ledgers
        if line["parent"] is None
    }
    return {"position": position, "at_ms": at_ms, "roots": roots}


class Fabric:
    """The journal at ``db``, read-only, and everything the page asks of it."""

    def __init__(self, db: str | None = None, *, journal: Journal | None = None) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="charter-serve")
        self._given = journal
        self._db = db
        self._journal: Journal | None = None
        self._projector: Projector | None = None
        self._notable: list[dict[str, Any]] = []
        self._indexed = 0  # notable events are indexed up to here
        self._series: list[dict[str, Any]] = []
        self._closed = threading.Event()
        self.call(self._open)

    # -- the one thread ----------------------------------------------------------

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the fabric's thread and return what it returns."""
        return self._pool.submit(fn, *args).result()

    def submit(self, fn: Callable[..., T], *args: Any) -> Any:
        """``fn(*args)`` on the fabric's thread, as a future."""
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._pool.submit(self._close).result()
        self._pool.shutdown()

    def _open(self) -> None:
        self._journal = self._given or read_journal(self._db)
        self._projector = Projector(self._journal)
        position = self._projector.catch_up()
        self._index(position)
        for sample in sorted({max(1, position * k // _SAMPLES) for k in range(1, _SAMPLES + 1)}):
            if sample <= position:
                self._record_burn(sample, as_of=sample)

    def _close(self) -> None:
        if self._projector is not None:
            self._projector.close()
        if self._journal is not None and self._given is None:
            self._journal.close()

    # -- reading (on the fabric's thread) ------------------------------------------

    @property
    def journal(self) -> Journal:
        assert self._journal is not None
        return self._journal

    @property
    def projector(self) -> Projector:
        assert self._projector is not None
        return self._projector

    def head(self) -> int:
        """The journal's head position (0 when empty): a cheap read."""
        found = self.journal.head()
        return 0 if found is None else found[0]

    def catch_up(self) -> int:
        """Fold what was committed since, index its notable events: the new position."""
        position = self.projector.catch_up()
        self._index(position)
        return position

    def _index(self, position: int) -> None:
        if position <= self._indexed:
            return
        for entry in self.journal.entries(self._indexed + 1, position, types=NOTABLE):
            name = entry.topic.partition("/v")[0]
            self._notable.append(_notable(entry.position, entry.recorded_at, name, entry.event))
        del self._notable[:-_KEPT]
        self._indexed = position

    def _record_burn(self, position: int, *, as_of: int | None) -> None:
        self._add_burn(position, self.projector.budgets(None, as_of))

    def _add_burn(self, position: int, report: BudgetReport) -> None:
        if self._series and self._series[-1]["position"] >= position:
            return  # (the same position again: nothing moved)
        ledgers = [line.to_json() for line in report.ledgers if line.parent is None]
        self._series.append(_burn_point(position, report.at_ms, ledgers))
        if len(self._series) > _SERIES:
            newest = self._series[-1]
            self._series = self._series[::2]
            if self._series[-1] is not newest:
                self._series.append(newest)

    def fabric(self, as_of: int | None = None) -> dict[str, Any]:
        """Everything the page shows, as of ``as_of`` (default: the projected head)."""
        if as_of is None:
            self.catch_up()
        projector = self.projector
        tree = projector.tree(None, as_of)
        position = tree.as_of
        budgets = projector.budgets(None, position if as_of is not None else None)
        slots = projector.slots(position if as_of is not None else None)
        if as_of is None:
            self._add_burn(position, budgets)
        head = self.head()
        seen = [e for e in self._notable if e["position"] <= position]
        verdicts = {e["lineage"]: _VERDICTS[e["type"]] for e in seen if e["type"] in _VERDICTS}
        events = seen[-_LISTED:]
        earliest = self._notable[0]["position"] if len(self._notable) >= _KEPT else 0
        return {
            "position": position,
            "head": max(head, position),
            "live": as_of is None,
            "journal": self.journal.location.display,
            "tree": tree.to_json(),
            "budgets": budgets.to_json(),
            "slots": slots.to_json(),
            "events": events[::-1],
            "verdicts": verdicts,
            "events_from": earliest,
            "burndown": [p for p in self._series if p["position"] <= position],
        }
