"""The auditor's own lease books: what each ledger uses at a time, kept incrementally.

THE lease formula (:mod:`charter.budgets.formula`) defines a child's charge; these books
keep, for every ledger, the sum of the allocations of its children still counted live
and the sum of the charges of those that ended, so checking a ledger costs O(log n)
(expired children leave the live sum lazily, from a heap of expiries), not a walk over
all its children and their subtrees. Each ledger also keeps its headroom (allocation −
the children's sums) and whether it is over its allocation on some axis, recomputed
whenever its spend or its children's sums change (:meth:`Books.rebase`): the audit's
conservation check of a usage's whole chain then reads one flag per ledger. And each
ledger caches, for the books' current epoch, until when its whole chain stays calm
(:meth:`Books.calm`): live, counted live, within its allocation, with no child's expiry
due; a usage of a calm ledger changes only its own spend and over flag and its chain's
subtree sums. Every change that could end a chain's calm (a release, a renewal, an end,
an expiry pushed or settled, a ledger's sums or over flag) starts a new epoch. Pure: no
journal.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from charter.budgets.formula import charge
from charter.core.budget import VEC_ZERO, Vec, vec_add, vec_sub

__all__ = ["Books", "Ledger", "rebase"]


@dataclass
class Ledger:
    lineage: str
    parent: str | None
    allocation: Vec
    expires: int | None
    released: int | None = None
    spent: Vec = VEC_ZERO  # own
    subtree: Vec = VEC_ZERO  # own and every descendant's (a root's is not kept: unread)
    children: list[str] = field(default_factory=list)
    live_alloc: Vec = VEC_ZERO  # Σ allocation of the children counted live
    ended_charge: Vec = VEC_ZERO  # Σ charge of the children counted ended
    counted_live: bool = True  # how its parent counts it
    counted_charge: Vec = VEC_ZERO  # what its parent counts for it once ended
    # children's expiries: (expires, sequence, lineages), one entry per grant of a group
    expiries: list[tuple[int, int, tuple[str, ...]]] = field(default_factory=list)
    # it and its ancestors, up to the root (a ledger's parent never changes)
    path: tuple[Ledger, ...] = ()
    # allocation − live_alloc − ended_charge, and whether spent exceeds it on an axis
    # (own spend + Σ charge(children) > allocation): kept by Books.rebase
    headroom: Vec = VEC_ZERO
    over: bool = False
    # its ancestors whose subtree sum is kept: all but the root
    above: tuple[Ledger, ...] = ()
    # for t < calm_until, as of the books' epoch calm_epoch, the whole path is calm
    calm_epoch: int = -1
    calm_until: int = 0

    def __post_init__(self) -> None:
        rebase(self)

    def live(self, t: int) -> bool:
        """:func:`charter.budgets.formula.is_active`, inlined: the audit's hot path."""
        released = self.released
        if released is not None and released <= t:
            return False
        expires = self.expires
        return expires is None or t < expires


def rebase(ledger: Ledger) -> None:
    """Recompute ``ledger``'s headroom and over flag from its allocation, spend and
    children's sums (after any of them changed)."""
    c, live, ended, s = ledger.allocation, ledger.live_alloc, ledger.ended_charge, ledger.spent
    h = ledger.headroom = (
        c[0] - live[0] - ended[0],
        c[1] - live[1] - ended[1],
        c[2] - live[2] - ended[2],
        c[3] - live[3] - ended[3],
        c[4] - live[4] - ended[4],
    )
    ledger.over = s[0] > h[0] or s[1] > h[1] or s[2] > h[2] or s[3] > h[3] or s[4] > h[4]


_NEVER = 1 << 62  # past any commit time (datetime's range, in ms)


class Books:
    """Ledgers by lineage, with each parent's sums kept current."""

    def __init__(self) -> None:
        self.ledgers: dict[str, Ledger] = {}
        self._seq = 0
        self.epoch = 0  # a new one whenever a chain's calm may have ended

    def calm(self, ledger: Ledger) -> int:
        """Set ``ledger``'s calm for the current epoch and return it: until when
        (``calm_until``, 0 if not now) every ledger of its path is live, counted live by
        its parent, not over its allocation and has no child whose expiry is due."""
        until = _NEVER
        for node in ledger.path:
            if node.over or not node.counted_live:
                until = 0
                break
            released, expires, expiries = node.released, node.expires, node.expiries
            if released is not None and released < until:
                until = released
            if expires is not None and expires < until:
                until = expires
            if expiries and expiries[0][0] < until:
                until = expiries[0][0]
        ledger.calm_until = until
        ledger.calm_epoch = self.epoch
        return until

    def get(self, lineage: str) -> Ledger | None:
        return self.ledgers.get(lineage)

    def open_root(self, lineage: str, allocation: Vec) -> None:
        root = self.ledgers[lineage] = Ledger(lineage, None, allocation, None)
        root.path = (root,)
        self.epoch += 1

    def grant(
        self, parent: Ledger, lineages: tuple[str, ...], allocation: Vec, expires: int
    ) -> None:
        """Leases of one fan-out: the same allocation and expiry for each lineage."""
        for lineage in lineages:
            child = self.ledgers[lineage] = Ledger(lineage, parent.lineage, allocation, expires)
            child.path = (child, *parent.path)
            child.above = parent.path[:-1]
            parent.children.append(lineage)
            parent.live_alloc = vec_add(parent.live_alloc, allocation)
        rebase(parent)
        self._push(parent, expires, lineages)

    def _push(self, parent: Ledger, expires: int, lineages: tuple[str, ...]) -> None:
        self._seq += 1
        self.epoch += 1
        heapq.heappush(parent.expiries, (expires, self._seq, lineages))

    def _end(self, parent: Ledger, child: Ledger) -> None:
        """Count ``child`` as ended in its parent's sums (once)."""
        if not child.counted_live:
            return
        child.counted_live = False
        self.epoch += 1
        child.counted_charge = charge(child.allocation, child.subtree, False)
        parent.live_alloc = vec_sub(parent.live_alloc, child.allocation)
        parent.ended_charge = vec_add(parent.ended_charge, child.counted_charge)
        rebase(parent)

    def settle(self, ledger: Ledger, t: int) -> None:
        """Move the children that expired by ``t`` from the live sum to the ended one."""
        while ledger.expiries and ledger.expiries[0][0] <= t:
            self.epoch += 1
            expires, _, lineages = heapq.heappop(ledger.expiries)
            for lineage in lineages:
                child = self.ledgers[lineage]
                if child.expires == expires and not child.live(t):
                    self._end(ledger, child)

    def ancestors(self, ledger: Ledger) -> tuple[Ledger, ...]:
        return ledger.path[1:]

    def use(
        self,
        ledger: Ledger,
        amount: Vec,
        t: int = 0,
        over: Callable[[Ledger, int], None] | None = None,
    ) -> None:
        """Charge ``amount`` to ``ledger``: its own spend and the subtree of it and each
        ancestor; an ended ledger's charge to its parent follows its subtree (the hot
        path: one pass over the path, the vector sums inlined). With ``over`` (a usage
        whose whole chain is live at ``t``), the same pass also settles each ledger's
        children expired by ``t`` and calls ``over(ledger, t)`` for each ledger then
        over its allocation: the same effects, in the same order, as using the whole
        chain first and checking it after, since a ledger's check reads only its own
        sums and its children's, which the pass has already brought up to date."""
        self.spend(ledger, amount)
        path = ledger.path
        for i, node in enumerate(path):
            if not node.counted_live and node.parent is not None:
                self.follow(path, i)
            if over is not None:
                expiries = node.expiries
                if expiries and expiries[0][0] <= t:
                    self.settle(node, t)  # children that expired by t: their charge
                if node.over:
                    over(node, t)

    def spend(self, ledger: Ledger, amount: Vec) -> bool:
        """Add ``amount`` to ``ledger``'s own spend and to the subtree sums of it and
        its ancestors (but the root's); whether it is now over its allocation. All a
        usage of a calm ledger (:meth:`calm`) changes (the hot path)."""
        a0, a1, a2, a3, a4 = amount
        was = s = ledger.spent
        ledger.spent = s = (s[0] + a0, s[1] + a1, s[2] + a2, s[3] + a3, s[4] + a4)
        h = ledger.headroom
        over = s[0] > h[0] or s[1] > h[1] or s[2] > h[2] or s[3] > h[3] or s[4] > h[4]
        if over is not ledger.over:
            ledger.over = over
            self.epoch += 1
        if ledger.parent is not None:
            # while nothing below it has spent, its subtree sum is its own spend
            u = ledger.subtree
            ledger.subtree = (
                s if u is was else (u[0] + a0, u[1] + a1, u[2] + a2, u[3] + a3, u[4] + a4)
            )
            for node in ledger.above:
                u = node.subtree
                node.subtree = (u[0] + a0, u[1] + a1, u[2] + a2, u[3] + a3, u[4] + a4)
        return over

    def check(self, path: tuple[Ledger, ...], t: int, over: Callable[[Ledger, int], None]) -> None:
        """Each ledger of ``path``, all live at ``t``: its children expired by ``t``
        settled, and ``over(ledger, t)`` for each then over its allocation (each ledger's
        books keep whether it is, :func:`rebase`). :meth:`use` with ``over`` does the
        same in its own pass."""
        for node in path:
            expiries = node.expiries
            if expiries and expiries[0][0] <= t:
                self.settle(node, t)  # children that expired by t: their charge
            if node.over:
                over(node, t)

    def follow(self, path: tuple[Ledger, ...], i: int) -> None:
        """``path[i]`` has ended and its subtree spend changed: its charge to its parent
        (``path[i + 1]``) follows its subtree."""
        node, parent = path[i], path[i + 1]
        new = charge(node.allocation, node.subtree, False)
        parent.ended_charge = vec_add(vec_sub(parent.ended_charge, node.counted_charge), new)
        node.counted_charge = new
        rebase(parent)
        self.epoch += 1

    def release(self, ledger: Ledger, t: int) -> None:
        self.epoch += 1
        stack = [ledger]
        while stack:
            node = stack.pop()
            if node.released is None:
                node.released = t
            if node.parent is not None:
                self._end(self.ledgers[node.parent], node)
            stack.extend(self.ledgers[c] for c in node.children)

    def renew(self, ledger: Ledger, expires: int, t: int) -> None:
        if ledger.parent is not None:
            self.settle(self.ledgers[ledger.parent], t)
        ledger.expires = expires
        self.epoch += 1
        if ledger.parent is None:
            return
        parent = self.ledgers[ledger.parent]
        if not ledger.counted_live and ledger.live(t):  # renewed after it had expired
            ledger.counted_live = True
            parent.ended_charge = vec_sub(parent.ended_charge, ledger.counted_charge)
            parent.live_alloc = vec_add(parent.live_alloc, ledger.allocation)
            rebase(parent)
        if ledger.counted_live:
            self._push(parent, expires, (ledger.lineage,))

    def used(self, ledger: Ledger, t: int) -> Vec:
        """Own spend + Σ charge(children) at ``t``."""
        if ledger.expiries and ledger.expiries[0][0] <= t:
            self.settle(ledger, t)
        s, live, ended = ledger.spent, ledger.live_alloc, ledger.ended_charge
        return (
            s[0] + live[0] + ended[0],
            s[1] + live[1] + ended[1],
            s[2] + live[2] + ended[2],
            s[3] + live[3] + ended[3],
            s[4] + live[4] + ended[4],
        )
