"""What the projections answer, computed from the rows as of one position.

Remaining budget depends on time (a lease that has expired is charged only what its
subtree spent), so it is computed here, at query time, from the ledger rows as of
position ``p`` and the commit time of entry ``p``, with the one lease formula
(:mod:`charter.budgets.formula`) that the lease book uses too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from charter.budgets import formula
from charter.core.budget import (
    VEC_ZERO,
    Budget,
    Vec,
    budget_of,
    vec_add,
)
from charter.projections._fold import (
    L_ALLOC,
    L_EXHAUSTED,
    L_EXPIRES,
    L_FROM,
    L_LINEAGE,
    L_PARENT,
    L_RELEASED,
    L_SPENT,
)

__all__ = [
    "BudgetLine",
    "Burn",
    "BudgetReport",
    "CellSlots",
    "SlotsReport",
    "TreeNode",
    "TreeReport",
    "gone_cells",
    "worker_shown",
]


def _vec(row: Sequence[Any], start: int) -> Vec:
    return (row[start], row[start + 1], row[start + 2], row[start + 3], row[start + 4])


def _active(row: Sequence[Any], at_ms: int) -> bool:
    return formula.is_active(row[L_RELEASED], row[L_EXPIRES], at_ms)


def _status(row: Sequence[Any], at_ms: int) -> str:
    return formula.status(row[L_RELEASED], row[L_EXPIRES], at_ms)


@dataclass(frozen=True)
class BudgetLine:
    """One budget ledger as of a position, evaluated at that position's commit time."""

    lineage: str
    parent: str | None
    status: str  # active | released | expired
    allocation: Budget
    spent: Budget
    subtree_spent: Budget
    outstanding: Budget
    remaining: Budget
    expires_at_ms: int | None
    released_at_ms: int | None
    exhausted: bool
    since: int  # position of the version this answer was read from

    def to_json(self) -> dict[str, Any]:
        return {
            "lineage": self.lineage,
            "parent": self.parent,
            "status": self.status,
            "allocation": self.allocation.model_dump(),
            "spent": self.spent.model_dump(),
            "subtree_spent": self.subtree_spent.model_dump(),
            "outstanding": self.outstanding.model_dump(),
            "remaining": self.remaining.model_dump(),
            "expires_at_ms": self.expires_at_ms,
            "released_at_ms": self.released_at_ms,
            "exhausted": self.exhausted,
            "since": self.since,
        }


@dataclass(frozen=True)
class BudgetReport:
    as_of: int
    at_ms: int
    ledgers: tuple[BudgetLine, ...]

    def get(self, lineage: str) -> BudgetLine:
        for line in self.ledgers:
            if line.lineage == lineage:
                return line
        raise KeyError(lineage)

    def to_json(self) -> dict[str, Any]:
        return {
            "as_of": self.as_of,
            "at_ms": self.at_ms,
            "ledgers": [line.to_json() for line in self.ledgers],
        }

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]], as_of: int, at_ms: int) -> BudgetReport:
        by_lineage = {row[L_LINEAGE]: row for row in rows}
        children: dict[str, list[str]] = {}
        for row in sorted(by_lineage.values(), key=lambda r: r[L_FROM]):
            if row[L_PARENT] is not None:
                children.setdefault(row[L_PARENT], []).append(row[L_LINEAGE])
        subtree: dict[str, Vec] = {}

        def subtree_spent(lineage: str) -> Vec:
            # Iterative post-order: trees may be deeper than Python's recursion limit.
            stack = [(lineage, False)]
            while stack:
                node, done = stack.pop()
                if node in subtree:
                    continue
                kids = [k for k in children.get(node, ()) if k in by_lineage]
                if done:
                    total = _vec(by_lineage[node], L_SPENT)
                    for kid in kids:
                        total = vec_add(total, subtree[kid])
                    subtree[node] = total
                else:
                    stack.append((node, True))
                    stack.extend((k, False) for k in kids)
            return subtree[lineage]

        lines = []
        for lineage, row in sorted(by_lineage.items()):
            outstanding = VEC_ZERO
            for kid in children.get(lineage, ()):
                kid_row = by_lineage[kid]
                alloc = _vec(kid_row, L_ALLOC)
                charge = formula.charge(alloc, subtree_spent(kid), _active(kid_row, at_ms))
                outstanding = vec_add(outstanding, charge)
            allocation = _vec(row, L_ALLOC)
            spent = _vec(row, L_SPENT)
            remaining = formula.remaining(allocation, spent, outstanding, _active(row, at_ms))
            lines.append(
                BudgetLine(
                    lineage=lineage,
                    parent=row[L_PARENT],
                    status=_status(row, at_ms),
                    allocation=budget_of(allocation),
                    spent=budget_of(spent),
                    subtree_spent=budget_of(subtree_spent(lineage)),
                    outstanding=budget_of(outstanding),
                    remaining=budget_of(remaining),
                    expires_at_ms=row[L_EXPIRES],
                    released_at_ms=row[L_RELEASED],
                    exhausted=bool(row[L_EXHAUSTED]),
                    since=row[L_FROM],
                )
            )
        return cls(as_of, at_ms, tuple(lines))


@dataclass(frozen=True)
class Burn:
    """What a node has used, as of the answer's position. ``source`` is ``sampled``: a
    live worker's latest ``WorkerSampled`` (its usage so far while it runs, never
    charged; ``position`` is that entry's), or ``charged``: what its lease has been
    charged (a worker's measured usage, once it ended; 0 before; ``position`` is the
    ledger version's)."""

    source: str  # sampled | charged
    cpu_ms: int
    wall_ms: int
    mem_bytes: int
    position: int

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "cpu_ms": self.cpu_ms,
            "wall_ms": self.wall_ms,
            "mem_bytes": self.mem_bytes,
            "position": self.position,
        }


@dataclass(frozen=True)
class TreeNode:
    lineage: str
    parent: str | None
    depth: int
    kind: str  # agent | worker
    position: int  # where it first appeared
    fanout: str | None
    status: str  # active | released | expired | no-ledger (its lease)
    # A scheduled worker's own status (charter.control.WorkerStatus): queued | admitted
    # | running | waiting | exited | failed | killed (None: nothing was scheduled for it,
    # such as an operator's spawn).
    worker: str | None = None
    # Tokens charged to its lease so far (the model door's calls; None: no ledger).
    tokens_spent: int | None = None
    # Its CPU, wall clock and peak memory: sampled while it runs, charged once it ended
    # (None: no ledger and no sample).
    burn: Burn | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "lineage": self.lineage,
            "parent": self.parent,
            "depth": self.depth,
            "kind": self.kind,
            "position": self.position,
            "fanout": self.fanout,
            "status": self.status,
            "worker": self.worker,
            "tokens_spent": self.tokens_spent,
            "burn": None if self.burn is None else self.burn.to_json(),
        }


@dataclass(frozen=True)
class TreeReport:
    as_of: int
    nodes: tuple[TreeNode, ...]  # sorted by lineage: every parent before its children

    def to_json(self) -> dict[str, Any]:
        return {"as_of": self.as_of, "nodes": [n.to_json() for n in self.nodes]}


@dataclass(frozen=True)
class CellSlots:
    cell: str
    caps: dict[str, int]
    cores: int
    failover_reserve: int
    since: int
    holders: dict[str, tuple[str, ...]]  # resource class → lineages, sorted
    # resource class → lineages waiting for a slot, first come first served
    queued: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # live | gone (its newest incarnation's claim lapsed, at the answer's time) | never-run
    state: str = "never-run"
    incarnation: int = 0
    claim_until_ms: int | None = None

    def occupancy(self, resource: str) -> int:
        return len(self.holders.get(resource, ()))

    def to_json(self) -> dict[str, Any]:
        resources = sorted(set(self.caps) | set(self.holders) | set(self.queued))
        return {
            "cell": self.cell,
            "cores": self.cores,
            "failover_reserve": self.failover_reserve,
            "since": self.since,
            "state": self.state,
            "incarnation": self.incarnation,
            "claim_until_ms": self.claim_until_ms,
            "slots": {
                r: {
                    "cap": self.caps.get(r),
                    "occupancy": self.occupancy(r),
                    "holders": list(self.holders.get(r, ())),
                    "queued": list(self.queued.get(r, ())),
                }
                for r in resources
            },
        }


@dataclass(frozen=True)
class SlotsReport:
    as_of: int
    cells: tuple[CellSlots, ...]

    def to_json(self) -> dict[str, Any]:
        return {"as_of": self.as_of, "cells": [c.to_json() for c in self.cells]}

    @classmethod
    def from_rows(
        cls,
        cells: Iterable[Sequence[Any]],
        slots: Iterable[Sequence[Any]],
        as_of: int,
        queue: Iterable[Sequence[Any]] = (),
        claims: Iterable[Sequence[Any]] = (),
        at_ms: int = 0,
    ) -> SlotsReport:
        claimed = {str(r[0]): (int(r[3]), r[4]) for r in claims}
        gone = gone_cells(claims, at_ms)
        holders: dict[str, dict[str, list[str]]] = {}
        for cell, resource, lineage, _, _ in slots:
            holders.setdefault(cell, {}).setdefault(resource, []).append(lineage)
        waiting: dict[str, dict[str, list[str]]] = {}
        # In queue order: the position it was queued at, then its place in that event.
        for cell, resource, lineage, _, _, _ in sorted(queue, key=lambda r: (r[3], r[5])):
            waiting.setdefault(cell, {}).setdefault(resource, []).append(lineage)
        out = []
        for cell, valid_from, _, caps, cores, reserve in sorted(cells, key=lambda r: str(r[0])):
            held = holders.get(cell, {})
            out.append(
                CellSlots(
                    cell=cell,
                    caps={str(k): int(v) for k, v in json.loads(caps).items()},
                    cores=int(cores),
                    failover_reserve=int(reserve),
                    since=int(valid_from),
                    holders={r: tuple(sorted(ls)) for r, ls in sorted(held.items())},
                    queued={r: tuple(ls) for r, ls in sorted(waiting.get(cell, {}).items())},
                    state=(
                        "never-run" if cell not in claimed else "gone" if cell in gone else "live"
                    ),
                    incarnation=claimed.get(cell, (0, None))[0],
                    claim_until_ms=claimed.get(cell, (0, None))[1],
                )
            )
        return cls(as_of, tuple(out))


def burns(ledgers: Iterable[Sequence[Any]], samples: Iterable[Sequence[Any]]) -> dict[str, Burn]:
    """Each lineage's burn from its ledger row and its current sample row (lineage,
    valid_from, valid_to, wall_ms, cpu_ms, memory_bytes), as of one position: the sample
    while there is one (a worker that has not ended), else the ledger's charge."""
    out = {
        str(row[L_LINEAGE]): Burn(
            "charged",
            cpu_ms=int(row[L_SPENT + 2]),
            wall_ms=int(row[L_SPENT + 1]),
            mem_bytes=int(row[L_SPENT + 3]),
            position=int(row[L_FROM]),
        )
        for row in ledgers
    }
    for lineage, valid_from, _, wall_ms, cpu_ms, memory_bytes in samples:
        out[str(lineage)] = Burn(
            "sampled", cpu_ms=int(cpu_ms), wall_ms=int(wall_ms), mem_bytes=int(memory_bytes),
            position=int(valid_from),
        )  # fmt: skip
    return out


def gone_cells(claims: Iterable[Sequence[Any]], at_ms: int) -> set[str]:
    """The cells whose newest incarnation's claim (rows of cell, valid_from, valid_to,
    incarnation, until_ms) has lapsed at ``at_ms``: gone by time, as any reader derives
    it (a claim with no bound never lapses)."""
    return {str(r[0]) for r in claims if r[4] is not None and at_ms >= int(r[4])}


def worker_shown(row: Sequence[Any], gone: set[str]) -> str:
    """A worker row's status (lineage, valid_from, valid_to, cell, status) as shown at the
    answer's time: a started worker of a cell gone by time is ``lost`` (the next
    incarnation journals it so)."""
    status = str(row[4])
    return "lost" if status in ("running", "waiting") and str(row[3]) in gone else status
