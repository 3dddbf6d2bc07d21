"""A root agent with a budget, on a real journal, for the budget and admission tests."""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from charter.authority import (
    Clearance,
    FixedPolicy,
    PermissionMode,
    RequestedGrant,
    SpawnIntent,
    Verdict,
)
from charter.budgets import LEASE_EVENTS, LeaseBook, LeaseGranted
from charter.control import Caller, Ceiling, SpawnService, register_root
from charter.core import Budget, KeyStore, entry_ms
from charter.ledger import Journal

if TYPE_CHECKING:  # not imported by the mixers' processes, which use this module too
    import pytest

ROOT_BUDGET = Budget.parse("tokens=10M,wall=10h,cpu=10h,mem=64GiB,egress=10GB")


def ceiling(budget: Budget = ROOT_BUDGET, depth: int = 7, fanout: int = 5000) -> Ceiling:
    return Ceiling(
        budget=budget,
        clearance=Clearance.INTERNAL,
        mode=PermissionMode.DEFAULT,
        depth=depth,
        fanout=fanout,
        tools=frozenset({"Read"}),
        egress=frozenset(),
        secrets=frozenset(),
    )


def service(journal: Journal, keystore: KeyStore) -> SpawnService:
    return SpawnService(journal, keystore=keystore, policy=FixedPolicy(Verdict.POSITIVE))


def intent(width: int, cost: Budget, *, fanout: int = 50) -> SpawnIntent:
    """A fan-out whose workers may spawn ``fanout`` more in their subtrees."""
    grant = RequestedGrant(fanout=fanout)
    return SpawnIntent(
        width=width, objective="scan the estate host by host", grant=grant, estimated_cost=cost
    )


@dataclass
class Brief:
    """A root on a fresh journal, its spawn service, and one child it leased."""

    journal: Journal
    svc: SpawnService
    root: Caller
    child: str
    expires_ms: int  # the child's lease's end


def a_root_and_a_child(url: str, home: Path, root: Budget, child: Budget) -> Brief:
    keys = KeyStore(home)
    journal = Journal.create(url)
    register_root(journal, keys, "root", ceiling(root))
    svc = service(journal, keys)
    caller = svc.durable_caller("root")
    lineage = str(svc.spawn(caller, intent(1, child)).children[0].lineage)
    expires = svc.resources.book.get(lineage).expires_at_ms or 0
    return Brief(journal, svc, caller, lineage, expires)


def watch_fan_outs(
    monkeypatch: pytest.MonkeyPatch, between: Callable[[], object] | None = None
) -> list[tuple[int | None, int | None]]:
    """Spy on every append that grants leases (the real append runs): each one's
    ``(expect_head, not_before_ms)``. ``between`` runs once, just before the first that
    pins the journal's head (a commit in the window between its read and its append)."""
    seen: list[tuple[int | None, int | None]] = []
    append = Journal.append

    def spied(self: Journal, events: Any, **kwargs: Any) -> Any:
        events = list(events)
        if any(isinstance(e, LeaseGranted) for e in events):
            pinned = kwargs.get("expect_head")
            if between is not None and pinned is not None and not any(p for p, _ in seen):
                between()
            seen.append((pinned, kwargs.get("not_before_ms")))
        return append(self, events, **kwargs)

    monkeypatch.setattr(Journal, "append", spied)
    return seen


def check_every_position(journal: Journal) -> int:
    """Fold the lease events in order; after each, check the book's invariant at that
    entry's commit time. Returns how many positions were checked."""
    book = LeaseBook()
    checked = 0
    for entry in journal.entries(types=tuple(c.type_name for c in LEASE_EVENTS)):
        at = entry_ms(entry.recorded_at)
        book.apply(entry.event, at)
        total = Budget.zero()
        for ledger in book.ledgers():
            total = total + ledger.spent
            if ledger.active(at):
                used = ledger.spent + book.outstanding(ledger.lineage, at)
                assert used.fits_within(ledger.allocation), (entry.position, ledger.lineage)
        for root in (lg for lg in book.ledgers() if lg.parent is None):
            assert root.subtree_spent.fits_within(root.allocation), entry.position
        checked += 1
    return checked


def hold_a_lease(url: str, home: str, cost: str) -> None:
    """A worker process: take a lease under the root, spend a little, then block."""
    from charter.control import BudgetService

    with Journal.open(url) as journal:
        svc = service(journal, KeyStore(Path(home)))
        result = svc.spawn(svc.durable_caller("root"), intent(1, Budget.parse(cost)))
        child = str(result.children[0].lineage)
        spend = Budget.parse("tokens=1k,wall=1s,cpu=1s,mem=0,egress=0")
        BudgetService(journal).record_usage(child, spend)
        print(child, flush=True)
        time.sleep(3600)  # never releases: killed by the test


if __name__ == "__main__":
    random.seed(0)
    hold_a_lease(sys.argv[1], sys.argv[2], sys.argv[3])


__all__ = [
    "Brief",
    "Caller",
    "a_root_and_a_child",
    "ceiling",
    "check_every_position",
    "intent",
    "register_root",
    "watch_fan_outs",
    "service",
]
