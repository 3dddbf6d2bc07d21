"""Whole-history invariants, checked by an independent fold over a journal.

Written from the design (docs/design.md §5), not from Charter's lease code: it reads
each entry's type name, payload dict and commit time, and keeps its own books. Used
after concurrent, crash and fuzz runs, where a unit test of the code that keeps the
invariant would only re-run the same mistake.

The rules, for every ledger ``x`` at the commit time ``t`` of every position:

- conservation: if ``x`` is live at ``t``, own spend(x) + Σ charge(c, t) over its
  children ≤ allocation(x) on every axis, where a live child is charged its whole
  allocation and an ended one what its subtree spent, capped at its allocation;
- no usage after the end: a usage commits only while its lease and every ancestor's
  are live (not released at or before ``t``, ``t`` before the expiry);
- no lease granted or renewed after the end: a fan-out's leases commit only while
  their parent's lease and every ancestor's are live, a renewal only while its own are;
- leases bounded by their grants: a lease (as granted, and after every renewal) never
  ends after its sealed grant's expiry (read from the ``GrantMinted`` body), nor after
  its parent's lease;
- commit times never decrease with position.

Expiry only lowers charges, so the conservation check runs, at each entry, on the
ledgers whose sums that entry can raise: a lease grant's parent, and a usage's or a
renewal's whole ancestor chain. Each ledger keeps its children's charges as running
sums (advanced over the expiries passed), so a long history folds in linear time;
``check_history(…, walk=True)`` computes the same rule child by child.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import charter.catalogue  # noqa: F401 - every event type registered, to read any entry

AXES = ("tokens", "wall_ms", "cpu_ms", "mem_bytes", "egress_bytes")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ms(at: datetime) -> int:
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _vec(d: dict[str, Any]) -> list[int]:
    return [int(d[a]) for a in AXES]


@dataclass
class _Ledger:
    lineage: str
    parent: str | None
    allocation: list[int]
    expires: int | None
    released: int | None = None
    spent: list[int] = field(default_factory=lambda: [0] * 5)
    subtree: list[int] = field(default_factory=lambda: [0] * 5)  # own spend + descendants'
    children: list[str] = field(default_factory=list)
    # In its parent's sums: ``open`` (charged its allocation) until it is known to have
    # ended, then what its subtree spent, capped (``charged``).
    open: bool = True
    charged: list[int] = field(default_factory=lambda: [0] * 5)
    # Its children's sums, and their expiries (a heap; stale entries are skipped).
    open_alloc: list[int] = field(default_factory=lambda: [0] * 5)
    ended: list[int] = field(default_factory=lambda: [0] * 5)
    expiries: list[tuple[int, str]] = field(default_factory=list)

    def live(self, t: int) -> bool:
        if self.released is not None and self.released <= t:
            return False
        return self.expires is None or t < self.expires


def _add(a: list[int], b: list[int]) -> list[int]:
    return [x + y for x, y in zip(a, b, strict=True)]


def _sub(a: list[int], b: list[int]) -> list[int]:
    return [x - y for x, y in zip(a, b, strict=True)]


def _cap(spent: list[int], allocation: list[int]) -> list[int]:
    return [min(s, a) for s, a in zip(spent, allocation, strict=True)]


@dataclass
class Findings:
    checked: int = 0
    problems: list[str] = field(default_factory=list)


class _Books:
    """The ledgers, with each one's children's charges kept as two sums (the open
    children's allocations, the ended ones' capped spend), so a check at time ``t``
    costs the expiries passed since the last one, not a walk of every child.
    :meth:`overspent_by_walk` is the same rule computed child by child (the reference
    the sums are tested against, and the rule used if commit times ever go back)."""

    def __init__(self) -> None:
        self.ledgers: dict[str, _Ledger] = {}
        self.latest = 0  # the latest commit time folded (the sums hold from it on)

    def open(self, ledger: _Ledger) -> None:
        self.ledgers[ledger.lineage] = ledger
        if ledger.parent is not None:
            parent = self.ledgers[ledger.parent]
            parent.children.append(ledger.lineage)
            parent.open_alloc = _add(parent.open_alloc, ledger.allocation)
            if ledger.expires is not None:
                heapq.heappush(parent.expiries, (ledger.expires, ledger.lineage))

    def close(self, child: _Ledger) -> None:
        """``child`` has ended: its parent is charged what its subtree spent."""
        if child.parent is None or not child.open:
            return
        parent = self.ledgers[child.parent]
        child.open, child.charged = False, _cap(child.subtree, child.allocation)
        parent.open_alloc = _sub(parent.open_alloc, child.allocation)
        parent.ended = _add(parent.ended, child.charged)

    def reopen(self, child: _Ledger) -> None:
        """A renewal moved an expired child's end later: it is charged in full again."""
        parent = self.ledgers[child.parent] if child.parent is not None else None
        if parent is None or child.open:
            return
        child.open = True
        parent.ended = _sub(parent.ended, child.charged)
        parent.open_alloc = _add(parent.open_alloc, child.allocation)

    def spend(self, lineage: str, amount: list[int]) -> None:
        node: _Ledger | None = self.ledgers[lineage]
        node.spent = _add(node.spent, amount)  # type: ignore[union-attr]
        while node is not None:
            node.subtree = _add(node.subtree, amount)
            parent = self.ledgers[node.parent] if node.parent is not None else None
            if parent is not None and not node.open:  # an ended child's charge follows
                charged = _cap(node.subtree, node.allocation)
                parent.ended = _add(_sub(parent.ended, node.charged), charged)
                node.charged = charged
            node = parent

    def advance(self, x: _Ledger, t: int) -> None:
        heap = x.expiries
        while heap and heap[0][0] <= t:
            expires, lineage = heapq.heappop(heap)
            child = self.ledgers[lineage]
            if child.expires == expires:
                self.close(child)

    def subtree_spent(self, lineage: str) -> list[int]:
        total = [0] * 5
        stack = [lineage]
        while stack:
            node = self.ledgers[stack.pop()]
            total = _add(total, node.spent)
            stack.extend(node.children)
        return total

    def charge(self, child: _Ledger, t: int) -> list[int]:
        if child.live(t):
            return child.allocation
        return _cap(self.subtree_spent(child.lineage), child.allocation)

    def ancestors(self, lineage: str) -> list[_Ledger]:
        out = []
        node = self.ledgers[lineage]
        while node.parent is not None:
            node = self.ledgers[node.parent]
            out.append(node)
        return out

    def _report(self, x: _Ledger, used: list[int]) -> str | None:
        over = [a for a, u, cap in zip(AXES, used, x.allocation, strict=True) if u > cap]
        if over:
            return f"{x.lineage} uses {used} of {x.allocation} ({', '.join(over)})"
        return None

    def overspent(self, lineage: str, t: int) -> str | None:
        x = self.ledgers[lineage]
        if not x.live(t):
            return None
        if t < self.latest:  # commit times went back (reported): the exact walk
            return self.overspent_by_walk(lineage, t)
        self.advance(x, t)
        return self._report(x, _add(x.spent, _add(x.open_alloc, x.ended)))

    def overspent_by_walk(self, lineage: str, t: int) -> str | None:
        x = self.ledgers[lineage]
        if not x.live(t):
            return None
        used = list(x.spent)
        for c in x.children:
            used = _add(used, self.charge(self.ledgers[c], t))
        return self._report(x, used)


def _grant_expiry(body: str) -> int:
    """A sealed grant's expiry, read from its stored canonical JSON."""
    return int(json.loads(body)["terms"]["expires_at_ms"])


def check_history(
    entries: Iterable[tuple[int, str, dict[str, Any], datetime]], *, walk: bool = False
) -> Findings:
    """Fold ``(position, type name, payload, recorded_at)`` in position order.
    ``walk`` checks conservation child by child (the slow reference for the sums)."""
    books = _Books()
    found = Findings()
    grant_end: dict[str, int] = {}  # lineage -> its sealed grant's expiry
    last_at: datetime | None = None
    for position, kind, p, at in entries:
        t = _ms(at)
        if last_at is not None and at < last_at:
            found.problems.append(f"{position}: commit time {at} is before {last_at}")
        last_at = at
        touched: list[str] = []
        bounds: list[str] = []
        match kind:
            case "GrantMinted":
                grant_end[p["lineage"]] = _grant_expiry(p["body"])
                continue
            case "BudgetLedgerOpened":
                books.open(_Ledger(p["lineage"], None, _vec(p["allocation"]), None))
            case "LeaseGranted":
                parent = books.ledgers[p["parent"]]
                dead = [n.lineage for n in (parent, *books.ancestors(parent.lineage))]
                dead = [x for x in dead if not books.ledgers[x].live(t)]
                if dead:
                    found.problems.append(
                        f"{position}: lease granted by {parent.lineage} after the end of "
                        f"{dead[0]}'s lease"
                    )
                expires = int(p["expires_at_ms"])
                for lineage in p["lineages"]:
                    books.open(_Ledger(lineage, p["parent"], _vec(p["allocation"]), expires))
                    bounds.append(lineage)
                touched = [p["parent"]]
            case "UsageRecorded":
                x = books.ledgers[p["lineage"]]
                dead = [n.lineage for n in (x, *books.ancestors(x.lineage)) if not n.live(t)]
                if dead:
                    found.problems.append(
                        f"{position}: usage of {x.lineage} after the end of {dead[0]}'s lease"
                    )
                books.spend(x.lineage, _vec(p["amount"]))
                touched = [x.lineage, *(n.lineage for n in books.ancestors(x.lineage))]
            case "LeaseReleased":
                stack = [p["lineage"]]
                while stack:
                    node = books.ledgers[stack.pop()]
                    if node.released is None:
                        node.released = t
                        books.close(node)
                    stack.extend(node.children)
            case "LeaseRenewed":
                x = books.ledgers[p["lineage"]]
                dead = [n.lineage for n in (x, *books.ancestors(x.lineage)) if not n.live(t)]
                if dead:
                    found.problems.append(
                        f"{position}: renewal of {x.lineage} after the end of {dead[0]}'s lease"
                    )
                x.expires = int(p["expires_at_ms"])
                if x.released is None:
                    books.reopen(x)
                    heapq.heappush(books.ledgers[p["parent"]].expiries, (x.expires, x.lineage))
                bounds.append(x.lineage)
                touched = [p["parent"], *(n.lineage for n in books.ancestors(p["parent"]))]
            case _:
                continue
        for lineage in bounds:  # a lease never ends after its grant or its parent's lease
            x = books.ledgers[lineage]
            parent = books.ledgers[x.parent] if x.parent is not None else None
            if x.expires is not None and lineage in grant_end and x.expires > grant_end[lineage]:
                found.problems.append(
                    f"{position}: {lineage}'s lease ends at {x.expires}, after its grant's "
                    f"expiry {grant_end[lineage]}"
                )
            above = parent.expires if parent is not None else None
            if x.expires is not None and above is not None and x.expires > above:
                found.problems.append(
                    f"{position}: {lineage}'s lease ends at {x.expires}, after its parent's {above}"
                )
        check = books.overspent_by_walk if walk else books.overspent
        for lineage in touched:
            problem = check(lineage, t)
            if problem is not None:
                found.problems.append(f"{position}: {problem}")
        books.latest = max(books.latest, t)
        found.checked += 1
    return found


def journal_history(journal: Any) -> list[tuple[int, str, dict[str, Any], datetime]]:
    """Every entry of a Charter journal as (position, type, payload, recorded_at)."""
    return [(e.position, e.type_name, e.event.payload(), e.recorded_at) for e in journal.entries()]


# -- the cell: worker lifecycles and slots ------------------------------------------
#
# Written from DESIGN §1, §5 and §7, not from the cell's code:
# - a sandbox starts only after its lease is committed; a worker's sandbox only after
#   the worker's schedule; no sandbox starts twice and no worker starts twice;
# - at every position, each cell's holders of a class are at most its configured cap
#   for that class, and at most the cap the admitting event says was in force;
# - a kill is committed before its sandbox's exit;
# and, once the cell is idle (``check_settled``): every scheduled worker ended, no slot
# is held by an ended worker, and every started sandbox was discarded.


@dataclass
class _Cells:
    caps: dict[str, dict[str, int]] = field(default_factory=dict)
    holders: dict[tuple[str, str], set[str]] = field(default_factory=dict)


def check_workers(entries: Iterable[tuple[int, str, dict[str, Any], datetime]]) -> Findings:
    found = Findings()
    cells = _Cells()
    leased: dict[str, str | None] = {}  # sandbox -> lineage
    scheduled: set[str] = set()
    started_workers: set[str] = set()
    started_sandboxes: set[str] = set()
    killed: set[str] = set()
    sandbox_of: dict[str, str] = {}
    for position, kind, p, _at in entries:
        match kind:
            case "CellConfigured":
                cells.caps[p["cell"]] = {str(k): int(v) for k, v in p["caps"].items()}
            case "SlotAdmitted":
                key = (p["cell"], p["resource"])
                held = cells.holders.setdefault(key, set())
                held.add(p["lineage"])
                configured = cells.caps.get(p["cell"], {}).get(p["resource"], 0)
                if len(held) > min(configured, int(p["cap"])):
                    found.problems.append(
                        f"{position}: {p['cell']} {p['resource']} holds {len(held)} over its "
                        f"cap ({configured} configured, {p['cap']} in force)"
                    )
            case "SlotReleased":
                cells.holders.setdefault((p["cell"], p["resource"]), set()).discard(p["lineage"])
            case "WorkerScheduled":
                scheduled.add(p["lineage"])
            case "SandboxLeased":
                leased[p["sandbox_id"]] = p.get("lineage")
            case "WorkerStarted":
                if p["lineage"] in started_workers:
                    found.problems.append(f"{position}: {p['lineage']} started twice")
                if p["lineage"] not in scheduled:
                    found.problems.append(f"{position}: {p['lineage']} started unscheduled")
                started_workers.add(p["lineage"])
                sandbox_of[p["sandbox_id"]] = p["lineage"]
            case "SandboxStarted":
                sid = p["sandbox_id"]
                if sid in started_sandboxes:
                    found.problems.append(f"{position}: sandbox {sid} started twice")
                started_sandboxes.add(sid)
                if sid not in leased:
                    found.problems.append(f"{position}: sandbox {sid} started before its lease")
                elif leased[sid] is not None and leased[sid] not in scheduled:
                    found.problems.append(f"{position}: sandbox {sid} runs an unscheduled worker")
            case "WorkerKilled":
                killed.add(p["lineage"])
            case "WorkerEnded":
                if p["outcome"] == "killed" and p["lineage"] not in killed:
                    found.problems.append(f"{position}: {p['lineage']} killed with no kill event")
            case _:
                continue
        found.checked += 1
    return found


def check_settled(entries: Iterable[tuple[int, str, dict[str, Any], datetime]]) -> Findings:
    """After the cell went idle: every scheduled worker ended (exited, failed or
    killed), none holds a slot, every started sandbox was discarded."""
    found = Findings()
    scheduled: set[str] = set()
    ended: dict[str, str] = {}
    holders: dict[tuple[str, str], set[str]] = {}
    started: set[str] = set()
    discarded: set[str] = set()
    for _position, kind, p, _at in entries:
        found.checked += 1
        match kind:
            case "WorkerScheduled":
                scheduled.add(p["lineage"])
            case "WorkerEnded":
                ended[p["lineage"]] = p["outcome"]
            case "SlotAdmitted":
                holders.setdefault((p["cell"], p["resource"]), set()).add(p["lineage"])
            case "SlotReleased":
                holders.setdefault((p["cell"], p["resource"]), set()).discard(p["lineage"])
            case "SandboxStarted":
                started.add(p["sandbox_id"])
            case "SandboxDiscarded" | "SandboxQuarantined":  # either ends the sandbox
                discarded.add(p["sandbox_id"])
            case _:
                pass
    for lineage in sorted(scheduled - set(ended)):
        found.problems.append(f"{lineage} was scheduled and never ended")
    for (cell, resource), held in sorted(holders.items()):
        for lineage in sorted(held & set(ended)):
            found.problems.append(f"{lineage} ended but holds a {resource} slot on {cell}")
    for sid in sorted(started - discarded):
        found.problems.append(f"sandbox {sid} started and was never discarded")
    return found


# -- the journal allowance ------------------------------------------------------------
#
# Written from docs/door.md (decision 0012), not from the door's code: a worker's
# result costs its canonical payload plus 384 bytes, a wait its payload plus 6 x 384
# (its six entries), its children's schedules their argv and inputs as canonical JSON;
# at every position each worker's total is at most its lease's 131,072-byte floor plus
# the egress charged to it so far.

JOURNAL_FLOOR = 128 * 1024
JOURNAL_ENTRY_OVERHEAD = 384
JOURNAL_WAIT_ENTRIES = 6


def _canonical_size(value: Any) -> int:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8"))


def journal_bytes_by_worker(
    entries: Iterable[tuple[int, str, dict[str, Any], datetime]],
) -> dict[str, int]:
    """The journal bytes each worker caused, as the allowance counts them."""
    caused: dict[str, int] = {}
    for _position, kind, p, _at in entries:
        for lineage, size in _journal_charges(kind, p):
            caused[lineage] = caused.get(lineage, 0) + size
    return caused


def _journal_charges(kind: str, p: dict[str, Any]) -> list[tuple[str, int]]:
    match kind:
        case "WorkerResult":
            return [(p["lineage"], _canonical_size(p) + JOURNAL_ENTRY_OVERHEAD)]
        case "WorkerWaiting":
            overhead = JOURNAL_WAIT_ENTRIES * JOURNAL_ENTRY_OVERHEAD
            return [(p["lineage"], _canonical_size(p) + overhead)]
        case "WorkerScheduled":
            parent = p["lineage"].rpartition("/")[0]
            return [(parent, _canonical_size([p["argv"], p["inputs"]]))]
        case "ModelCallReserved":  # its reservation, its settlement and its usage
            return [(p["lineage"], _canonical_size(p) + 3 * JOURNAL_ENTRY_OVERHEAD)]
        case "ModelTokensHeld":  # its hold, its release and a recovery's usage
            return [(p["lineage"], _canonical_size(p) + 3 * JOURNAL_ENTRY_OVERHEAD)]
        case "ModelCallSettled" if p.get("block") is not None:  # drawn: it and its usage
            return [(p["lineage"], _canonical_size(p) + 2 * JOURNAL_ENTRY_OVERHEAD)]
        case _:
            return []


def check_journal_allowance(
    entries: Iterable[tuple[int, str, dict[str, Any], datetime]],
) -> Findings:
    found = Findings()
    workers: set[str] = set()
    caused: dict[str, int] = {}
    egress: dict[str, int] = {}
    for position, kind, p, _at in entries:
        if kind == "WorkerScheduled":
            workers.add(p["lineage"])
        if kind == "UsageRecorded":
            egress[p["lineage"]] = egress.get(p["lineage"], 0) + int(p["amount"]["egress_bytes"])
        for lineage, size in _journal_charges(kind, p):
            caused[lineage] = caused.get(lineage, 0) + size
            bound = JOURNAL_FLOOR + egress.get(lineage, 0)
            if lineage in workers and caused[lineage] > bound:
                found.problems.append(
                    f"{position}: {lineage} caused {caused[lineage]} journal bytes, over its "
                    f"floor and egress charged ({bound})"
                )
        found.checked += 1
    return found


# -- the model door: blocks, reservations and settlements ---------------------------
#
# Written from docs/model-door.md, not from the meter's code:
# - a block of a lease's tokens is held before any call drawing from it settles, and
#   released at most once; a call drawn from it settles on it while it is held, once;
# - a call reserved on its own (an older door's) is reserved before it is settled, and
#   settled at most once;
# - a settlement charges its tokens in the same append: the UsageRecorded just before
#   the run of settlements it is in (for the same lineage) charges or refuses exactly
#   the run's prompt + completion, unless the lease had ended (then the run is preceded
#   by that refusal); a recovered release
#   likewise charges its estimate, which is the block less what its settled calls
#   charged (never charged twice);
# - an exact settlement comes from the server's usage (``how`` usage); an estimate is
#   the prompt's estimate and at most ``max_tokens`` of completion; a drawn call's
#   reservation is its estimate plus its ``max_tokens``, within its block;
# - at every hold or reservation, and at every fan-out out of a lease holding blocks or
#   reservations, what the lease was charged in tokens and what its children cost it
#   (a live child its whole allocation, an ended one what its subtree was charged) plus
#   what its blocks still hold (each, its tokens less its settled calls' charges) and
#   every reservation of it still unsettled (this one included) is at most its
#   allocation: a spawn carves no tokens a block holds;
# - with ``settled``: every reservation was settled and every block released.


def _charged_in_append(previous: tuple[str, dict[str, Any]] | None, lineage: str, n: int) -> bool:
    if previous is None or previous[1].get("lineage") != lineage:
        return False
    kind, q = previous
    if kind == "BudgetRefused":  # the lease had ended (a refusal of its usage)
        return q.get("operation") == "usage"
    return kind == "UsageRecorded" and int(q["amount"]["tokens"]) + int(q["refused"]["tokens"]) == n


def check_model_calls(
    entries: Iterable[tuple[int, str, dict[str, Any], datetime]], *, settled: bool = True
) -> Findings:
    found = Findings()
    allocation: dict[str, int] = {}
    charged: dict[str, int] = {}
    children: dict[str, list[str]] = {}  # lineage -> its leased children
    ends: dict[str, int] = {}  # lineage -> when its lease ends (expiry or release), ms
    open_calls: dict[str, dict[str, Any]] = {}
    blocks: dict[str, dict[str, Any]] = {}  # held, not released: lineage, tokens, charged
    ended: set[str] = set()  # released blocks
    done: set[str] = set()
    previous: tuple[str, dict[str, Any]] | None = None
    before_at: datetime | None = None  # its recorded time (one append's entries share it)
    run: dict[str, Any] | None = None  # the settlements after a UsageRecorded or refusal

    def close(position: int) -> None:
        if run is not None and run["expected"] is not None and run["got"] != run["expected"]:
            found.problems.append(
                f"{position}: the settlements before it charge {run['got']} tokens; their "
                f"UsageRecorded charged {run['expected']}"
            )

    def spent(lineage: str, at_ms: int) -> int:
        """What ``lineage``'s subtree was charged (its children's as they cost it)."""
        return charged.get(lineage, 0) + sum(cost(c, at_ms) for c in children.get(lineage, ()))

    def cost(lineage: str, at_ms: int) -> int:
        if at_ms < ends[lineage]:
            return allocation[lineage]
        return min(spent(lineage, at_ms), allocation[lineage])

    def over(position: int, lineage: str, at_ms: int) -> None:
        outstanding = sum(c["reserved"] for c in open_calls.values() if c["lineage"] == lineage)
        outstanding += sum(
            max(b["tokens"] - b["charged"], 0) for b in blocks.values() if b["lineage"] == lineage
        )
        if not outstanding:
            return
        held = spent(lineage, at_ms) + outstanding
        if held > allocation.get(lineage, 0):
            found.problems.append(
                f"{position}: {lineage} holds {held} tokens charged and reserved, over "
                f"its allocation {allocation.get(lineage, 0)}"
            )

    for position, kind, p, at in entries:
        found.checked += 1
        at_ms = int(at.timestamp() * 1000)
        same = before_at == at  # the entry before is of this append
        if kind != "ModelCallSettled":
            close(position)
            run = None
        if kind == "LeaseGranted":
            for lineage in p["lineages"]:
                allocation[lineage] = int(p["allocation"]["tokens"])
                ends[lineage] = int(p["expires_at_ms"])
                children.setdefault(p["parent"], []).append(lineage)
            if p["parent"] in allocation:
                over(position, p["parent"], at_ms)
        elif kind == "LeaseRenewed":
            ends[p["lineage"]] = max(ends.get(p["lineage"], 0), int(p["expires_at_ms"]))
        elif kind == "LeaseReleased":
            stack = [p["lineage"]]
            while stack:  # the release ends the whole subtree
                lineage = stack.pop()
                if lineage in ends:
                    ends[lineage] = min(ends[lineage], at_ms)
                stack.extend(children.get(lineage, ()))
        elif kind == "UsageRecorded":
            charged[p["lineage"]] = charged.get(p["lineage"], 0) + int(p["amount"]["tokens"])
        elif kind == "ModelTokensHeld":
            if p["block"] in blocks or p["block"] in ended:
                found.problems.append(f"{position}: block {p['block']} held twice")
            blocks[p["block"]] = {"lineage": p["lineage"], "tokens": p["tokens"], "charged": 0}
            over(position, p["lineage"], at_ms)
        elif kind == "ModelTokensReleased":
            block = blocks.pop(p["block"], None)
            if block is None or block["lineage"] != p["lineage"]:
                found.problems.append(f"{position}: block {p['block']} released unheld or twice")
            else:
                ended.add(p["block"])
                remainder = max(block["tokens"] - block["charged"], 0)
                if p["recovered"] and p["charged"] != remainder:
                    found.problems.append(
                        f"{position}: block {p['block']} recovered charging {p['charged']}, "
                        f"not its remainder {remainder}"
                    )
                if p["charged"] and not (
                    _charged_in_append(previous, p["lineage"], p["charged"])
                    and (same or previous is None or previous[0] == "BudgetRefused")
                ):
                    found.problems.append(
                        f"{position}: block {p['block']}'s release does not charge its "
                        f"{p['charged']} tokens in its append"
                    )
        elif kind == "ModelCallReserved":
            call, lineage = p["call"], p["lineage"]
            if call in open_calls or call in done:
                found.problems.append(f"{position}: call {call} reserved twice")
            open_calls[call] = p
            over(position, lineage, at_ms)
        elif kind == "ModelCallSettled":
            call = p["call"]
            reserved: dict[str, Any] | None
            if p.get("block") is not None:
                block = blocks.get(p["block"])
                reserved = None if call in done or call in open_calls else p
                if block is None or block["lineage"] != p["lineage"]:
                    found.problems.append(f"{position}: call {call} settled on no held block")
                    reserved = None
                elif reserved is not None:
                    block["charged"] += p["prompt_tokens"] + p["completion_tokens"]
                    if p["reserved"] != p["prompt_estimate"] + p["max_tokens"]:
                        found.problems.append(f"{position}: call {call}'s reservation is off")
                    if p["reserved"] > block["tokens"]:
                        found.problems.append(f"{position}: call {call} drew more than its block")
            else:
                reserved = open_calls.pop(call, None)
            if reserved is None:
                found.problems.append(f"{position}: call {call} settled unreserved or twice")
            else:
                done.add(call)
                tokens = p["prompt_tokens"] + p["completion_tokens"]
                kind_before, q = previous if previous is not None else ("", {})
                if q.get("lineage") != p["lineage"]:
                    run = None
                elif kind_before == "BudgetRefused" and q.get("operation") == "usage":
                    run = {"expected": None, "got": 0}
                elif not same:  # charged in another append, or not at all
                    run = None
                elif kind_before == "UsageRecorded":
                    expected = int(q["amount"]["tokens"]) + int(q["refused"]["tokens"])
                    run = {"expected": expected, "got": 0}
                elif kind_before != "ModelCallSettled":
                    run = None
                if run is None:
                    found.problems.append(
                        f"{position}: call {call}'s settlement does not charge its {tokens} "
                        "tokens in its append"
                    )
                else:
                    run["got"] += tokens
                if p["estimated"] == (p["how"] == "usage"):
                    found.problems.append(
                        f"{position}: call {call} estimated={p['estimated']} "
                        f"but settled by {p['how']}"
                    )
                if p["estimated"] and (
                    p["prompt_tokens"] != reserved["prompt_estimate"]
                    or p["completion_tokens"] > reserved["max_tokens"]
                ):
                    found.problems.append(
                        f"{position}: call {call}'s estimate is not within its reservation"
                    )
        previous, before_at = (kind, p), at
    close(found.checked)
    if settled:
        found.problems.extend(f"call {c} was never settled" for c in open_calls)
        found.problems.extend(f"block {b} was never released" for b in blocks)
    return found


# -- delegation to own-sandbox agents ------------------------------------------------
#
# Written from docs/delegation.md, not from the pipeline's code:
# - a delegation is journaled before its reservation, which is carved out of its
#   caller's lease (the LeaseGranted naming the delegate has the caller as parent);
# - a delegate starts after its reservation, and never delegates itself;
# - its reply (at most one) follows its end, and goes to its caller.


def check_delegations(entries: Iterable[tuple[int, str, dict[str, Any], datetime]]) -> Findings:
    found = Findings()
    callers: dict[str, str] = {}  # delegate -> caller
    reserved: set[str] = set()
    ended: set[str] = set()
    replied: set[str] = set()
    leased: set[str] = set()  # every lineage leased so far
    for position, kind, p, _at in entries:
        found.checked += 1
        match kind:
            case "DelegationRequested":
                delegate, caller = p["delegate"], p["caller"]
                if delegate in leased or delegate in callers:
                    found.problems.append(f"{position}: {delegate} delegated after its lease")
                if caller in callers:
                    found.problems.append(f"{position}: delegate {caller} delegated")
                callers[delegate] = caller
            case "LeaseGranted":
                for lineage in p["lineages"]:
                    leased.add(lineage)
                    if lineage in callers:
                        reserved.add(lineage)
                        if p["parent"] != callers[lineage]:
                            found.problems.append(
                                f"{position}: {lineage} reserved out of {p['parent']}, not "
                                f"its caller {callers[lineage]}"
                            )
            case "WorkerStarted" if p["lineage"] in callers:
                if p["lineage"] not in reserved or p["lineage"] in replied:
                    found.problems.append(
                        f"{position}: delegate {p['lineage']} started out of order"
                    )
            case "WorkerEnded":
                ended.add(p["lineage"])
            case "DelegationReplied":
                delegate = p["delegate"]
                if delegate not in ended or delegate in replied:
                    found.problems.append(f"{position}: {delegate}'s reply out of order")
                if callers.get(delegate) != p["caller"]:
                    found.problems.append(f"{position}: {delegate}'s reply to {p['caller']}")
                replied.add(delegate)
            case _:
                pass
    return found


# -- the fabric's population and depth ceilings ----------------------------------------
#
# Written from docs/fabric.md, not from LivePopulation: a worker is live from the
# commit of its lease's grant until its lease (or an ancestor's) is released, or its
# expiry (as granted, or as last renewed while it was live) passes. At every position,
# the live workers are at most the population ceiling in force: the one the latest
# ``PopulationGrew`` recorded. Each ``PopulationGrew``'s own count is no lower than
# the live workers at its commit (a decision never counts fewer than there are).


def check_population(entries: Iterable[tuple[int, str, dict[str, Any], datetime]]) -> Findings:
    found = Findings()
    expiry: dict[str, int] = {}  # live (not known ended) lineage -> its expiry
    released: set[str] = set()
    children: dict[str, list[str]] = {}
    heap: list[tuple[int, str]] = []
    ceiling: int | None = None

    def live(t: int) -> int:
        while heap and heap[0][0] <= t:
            at, lineage = heapq.heappop(heap)
            if expiry.get(lineage) == at:
                del expiry[lineage]
        return len(expiry)

    for position, kind, p, at in entries:
        t = _ms(at)
        match kind:
            case "LeaseGranted":
                children.setdefault(p["parent"], []).extend(p["lineages"])
                if p["parent"] not in released:
                    for lineage in p["lineages"]:
                        expiry[lineage] = int(p["expires_at_ms"])
                        heapq.heappush(heap, (int(p["expires_at_ms"]), lineage))
            case "LeaseRenewed":
                lineage, until = p["lineage"], int(p["expires_at_ms"])
                if lineage not in released and t < until:
                    expiry[lineage] = until
                    heapq.heappush(heap, (until, lineage))
            case "LeaseReleased":
                stack = [p["lineage"]]
                while stack:
                    lineage = stack.pop()
                    if lineage not in released:
                        released.add(lineage)
                        expiry.pop(lineage, None)
                        stack.extend(children.get(lineage, ()))
            case "PopulationGrew":
                ceiling = int(p["ceiling"])
                if live(t) > int(p["live"]):
                    found.problems.append(
                        f"{position}: {live(t)} workers live, but the fan-out counted {p['live']}"
                    )
        found.checked += 1
        if ceiling is not None and live(t) > ceiling:
            found.problems.append(
                f"{position}: {live(t)} workers live, over the population ceiling of {ceiling}"
            )
    return found


def check_depth(
    entries: Iterable[tuple[int, str, dict[str, Any], datetime]], ceiling: int
) -> Findings:
    """No worker (a leased lineage) deeper than the depth ceiling (a root is depth 0)."""
    found = Findings()
    for position, kind, p, _at in entries:
        if kind != "LeaseGranted":
            continue
        found.checked += 1
        for lineage in p["lineages"]:
            if lineage.count("/") > ceiling:
                found.problems.append(
                    f"{position}: {lineage} is {lineage.count('/')} deep, over the depth "
                    f"ceiling of {ceiling}"
                )
    return found
