"""What a worker's sandbox runs under: its own lease and grant, never more than a slot.

Pure: the caps are the slot budget met with what the worker's lease holds now, the wall
clock cut to the first expiry of its lease chain or its grant (so the sandbox is killed
at that expiry by the wall clock the pool enforces), and the egress allow-list is its
grant's destinations and held secrets (by name), for the egress broker.
"""

from __future__ import annotations

from typing import NamedTuple

from charter.authority import GrantTerms
from charter.core import Budget
from charter.runner.errors import LeaseSpentError
from charter.sandbox import EgressGrant

__all__ = ["WorkerCaps", "worker_caps"]


class WorkerCaps(NamedTuple):
    budget: Budget  # the sandbox's caps (cpu, memory, wall, egress bytes)
    egress: EgressGrant  # where it may connect
    deadline_ms: int  # when it is killed at the latest (unix ms)


def worker_caps(
    slot: Budget,
    remaining: Budget,
    lease_deadline_ms: int | None,
    terms: GrantTerms,
    now_ms: int,
    *,
    withhold_credentials: bool = False,
) -> WorkerCaps:
    """The caps of a worker whose lease holds ``remaining`` at ``now_ms`` and expires
    (with its ancestors') at ``lease_deadline_ms``, under the grant ``terms``. Refuses
    (:class:`LeaseSpentError`) a worker with nothing left to run on."""
    ends = [terms.expires_at_ms] + ([] if lease_deadline_ms is None else [lease_deadline_ms])
    deadline = min(ends)
    budget = slot.minimum(remaining).minimum(terms.budget)
    wall = min(budget.wall_ms, deadline - now_ms)
    if wall <= 0 or budget.cpu_ms <= 0:
        raise LeaseSpentError(
            f"the lease has no time left to run (wall {max(wall, 0)} ms, "
            f"cpu {budget.cpu_ms} ms, expiry at {deadline} ms, now {now_ms} ms)"
        )
    capped = Budget(**(budget.model_dump() | {"wall_ms": wall}))
    return WorkerCaps(
        budget=capped,
        egress=EgressGrant(
            destinations=tuple(sorted(terms.egress)),
            secrets=tuple(sorted(terms.secrets)),
            withhold_credentials=withhold_credentials,  # a test run (spawn --dry-run)
        ),
        deadline_ms=deadline,
    )
