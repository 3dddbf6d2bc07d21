"""THE lease formula: when a lease is live, what a child costs its parent, and what a
ledger has left. The lease book (decisions), the projections (answers as of any
position) and the auditor all compute budgets with these functions and nothing else.

At a time ``t``, for a ledger with allocation ``A``, own spend ``s`` and children ``c``:

    active(t)      = not (released at or before t) and (no expiry or t < expiry)
    charge(c, t)   = A_c                        if c is active at t
                   = min(subtree spend of c, A_c) otherwise
    remaining(t)   = max(0, A − s − Σ charge(c, t))   per axis, if active at t; else 0

so the invariant, on every axis and at every time, is ``s + Σ charge(c, t) ≤ A``.
"""

from __future__ import annotations

from typing import Literal

from charter.core.budget import VEC_ZERO, Vec, vec_add, vec_min, vec_sat_sub

__all__ = ["LeaseStatus", "charge", "is_active", "remaining", "status"]

LeaseStatus = Literal["active", "released", "expired"]


def is_active(released_at_ms: int | None, expires_at_ms: int | None, at_ms: int) -> bool:
    """Whether a lease is live at ``at_ms`` (a durable agent's ledger has no expiry)."""
    if released_at_ms is not None and released_at_ms <= at_ms:
        return False
    return expires_at_ms is None or at_ms < expires_at_ms


def status(released_at_ms: int | None, expires_at_ms: int | None, at_ms: int) -> LeaseStatus:
    if is_active(released_at_ms, expires_at_ms, at_ms):
        return "active"
    return "released" if released_at_ms is not None and released_at_ms <= at_ms else "expired"


def charge(allocation: Vec, subtree_spent: Vec, active: bool) -> Vec:
    """What a child costs its parent: all of a live lease, else only what its subtree
    spent (never more than its allocation)."""
    return allocation if active else vec_min(subtree_spent, allocation)


def remaining(allocation: Vec, spent: Vec, outstanding: Vec, active: bool) -> Vec:
    """What a ledger can still spend or lease out: zero once it has ended."""
    return vec_sat_sub(allocation, vec_add(spent, outstanding)) if active else VEC_ZERO
