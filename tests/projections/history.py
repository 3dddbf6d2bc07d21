"""A generated, realistic history of spawns, leases, usage, releases, renewals and
admissions, decided by the ledger's own pure folds (LeaseBook, Cells) so every event is
one the ledger could have committed. Shared by the tests and bench/projections.py.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

from charter.authority import AgentRegistered, GrantMinted
from charter.budgets import (
    AdmissionRefused,
    AdmissionRefusedError,
    BudgetLedgerOpened,
    CapInputs,
    CellConfigured,
    Cells,
    LeaseBook,
    ResourceClass,
)
from charter.core import Budget, CharterError, Event

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BODY = "x" * 420  # about the size of a canonical grant body
_SIG = "ab" * 64


def ms_of(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class History:
    """Decides batches of events; each batch is one journal append."""

    def __init__(
        self,
        seed: int,
        *,
        roots: int = 2,
        max_depth: int = 3,
        width: int = 4,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        # ``clock``: the time decisions are taken at (the wall clock, or a test's own
        # clock that also stamps the journal, so a decision and its entry share a time).
        self.now = clock
        self.rng = random.Random(seed)
        self.book = LeaseBook()
        self.cells = Cells()
        self.max_depth = max_depth
        self.width = width
        self.roots = [f"agent:r{i}" for i in range(roots)]
        self.next_id = 0
        self.slot_of: dict[str, tuple[str, ResourceClass]] = {}
        self.inputs = CapInputs(cores=64, failover_reserve=2, load_average=1.0, live_peers=0)

    def _apply(self, events: list[Event]) -> list[Event]:
        at = self.now()
        for event in events:
            self.book.apply(event, at)
            self.cells.apply(event)
        return events

    def genesis(self) -> list[Event]:
        events: list[Event] = []
        big = Budget(tokens=10**7, wall_ms=10**8, cpu_ms=10**8, mem_bytes=2**40, egress_bytes=2**36)
        for root in self.roots:
            events.append(AgentRegistered(name=root[6:], lineage=root, trust_root="cd" * 32))
            events.append(BudgetLedgerOpened(lineage=root, allocation=big))
        caps = dict.fromkeys(ResourceClass, 30)
        for cell in ("c1", "c2"):
            events.append(CellConfigured(cell=cell, caps=caps, cores=64, failover_reserve=2))
        return self._apply(events)

    def _ledgers(self, *, active: bool, leases_only: bool = False) -> list[str]:
        at = self.now()
        return [
            ledger.lineage
            for ledger in self.book.ledgers()
            if (not active or ledger.active(at)) and not (leases_only and ledger.parent is None)
        ]

    def step(self) -> list[Event]:
        """One decided batch (possibly empty if the chosen decision was refused)."""
        kind = self.rng.choices(
            ["spawn", "usage", "release", "renew", "wait", "reconfigure"],
            weights=[30, 35, 12, 8, 5, 1],
        )[0]
        try:
            return self._apply(getattr(self, f"_{kind}")())
        except (CharterError, IndexError):  # refused, or nothing to choose from
            return []

    def batches(self, count: int) -> Iterator[list[Event]]:
        yield self.genesis()
        made = 0
        while made < count:
            batch = self.step()
            if batch:
                made += 1
                yield batch

    def _spawn(self) -> list[Event]:
        parents = [lin for lin in self._ledgers(active=True) if lin.count("/") < self.max_depth]
        parent = self.rng.choice(parents)
        at = self.now()
        remaining = self.book.remaining(parent, at)
        width = self.rng.randint(1, self.width)
        share = self.rng.choice([4, 8, 16, 64]) * width
        allocation = Budget(**{a: getattr(remaining, a) // share for a in Budget.AXES})
        children = []
        cap = self.book.get(parent).expires_at_ms  # a lease never outlives its parent's
        for _ in range(width):
            self.next_id += 1
            lineage = f"{parent}/sa-{self.next_id:x}"
            ttl = self.rng.choice([-50, 150, 300, 600, 60_000, 600_000])
            until = at + ttl if cap is None else min(at + ttl, cap)
            children.append((lineage, allocation, until, "00" * 32))
        leases = self.book.decide_leases(parent, children, at)
        fanout = f"f{self.next_id:x}"
        events: list[Event] = [
            GrantMinted(fanout=fanout, lineage=lin, issuer=parent, body=_BODY, signature=_SIG)
            for lin, _, _, _ in children
        ]
        events += leases
        cell = self.rng.choice(["c1", "c2"])
        lineages = [lin for lin, _, _, _ in children]
        try:
            admits = self.cells.decide_admit(cell, lineages, ResourceClass.PROCESSING, self.inputs)
        except AdmissionRefusedError as e:
            events.append(
                self.cells.refusal(cell, lineages[0], ResourceClass.PROCESSING, e, self.inputs)
            )
            return events
        for admit in admits:
            self.slot_of[admit.lineage] = (cell, ResourceClass.PROCESSING)
        return [*events, *admits]

    def _usage(self) -> list[Event]:
        lineage = self.rng.choice(self._ledgers(active=True))
        at = self.now()
        held = self.book.remaining(lineage, at)
        frac = self.rng.choice([0.01, 0.1, 0.5, 1.5])
        amount = Budget(**{a: int(getattr(held, a) * frac) + 1 for a in Budget.AXES})
        return [self.book.decide_usage(lineage, amount, at)]

    def _release(self) -> list[Event]:
        lineage = self.rng.choice(self._ledgers(active=True, leases_only=True))
        events: list[Event] = [self.book.decide_release(lineage, self.now())]
        slot = self.slot_of.pop(lineage, None)
        if slot is not None and lineage in self.cells.get(slot[0]).holders[slot[1]]:
            events.append(self.cells.decide_release(slot[0], lineage, slot[1]))
        return events

    def _renew(self) -> list[Event]:
        lineage = self.rng.choice(self._ledgers(active=True, leases_only=True))
        at = self.now()
        return [self.book.decide_renewal(lineage, at + self.rng.choice([100, 5_000]), at)]

    def _wait(self) -> list[Event]:
        if not self.slot_of:
            return []
        lineage = self.rng.choice(sorted(self.slot_of))
        cell, resource = self.slot_of[lineage]
        if resource is not ResourceClass.PROCESSING:
            return []
        events = self.cells.decide_wait_on_children(cell, lineage)
        self.slot_of[lineage] = (cell, ResourceClass.COORDINATION)
        return list(events)

    def _reconfigure(self) -> list[Event]:
        cell = self.rng.choice(["c1", "c2"])
        state = self.cells.get(cell)
        # Never below the slots held (Cells.decide_configure refuses that).
        caps = {r: max(state.occupancy(r), self.rng.randint(10, 40)) for r in ResourceClass}
        return [self.cells.decide_configure(cell, caps, cores=64, failover_reserve=2)]


__all__ = ["AdmissionRefused", "History", "ms_of", "now_ms"]
