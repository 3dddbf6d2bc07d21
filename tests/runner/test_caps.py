"""The pure decision of what a worker's sandbox runs under (no sandbox needed)."""

from __future__ import annotations

import pytest

from charter.authority import Clearance, GrantTerms, PermissionMode
from charter.core import Budget
from charter.runner._caps import worker_caps
from charter.runner.errors import LeaseSpentError

SLOT = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=256MiB,egress=10MB")
NOW = 1_000_000


def terms(budget: str, expires_in_ms: int, egress: frozenset[str] = frozenset()) -> GrantTerms:
    return GrantTerms(
        tools=frozenset(), egress=egress, secrets=frozenset(), clearance=Clearance.INTERNAL,
        mode=PermissionMode.DEFAULT, depth=0, fanout=0, budget=Budget.parse(budget),
        expires_at_ms=NOW + expires_in_ms,
    )  # fmt: skip


def test_each_axis_is_the_narrowest_of_slot_lease_and_grant() -> None:
    lease = Budget.parse("tokens=5,wall=2h,cpu=20s,mem=1GiB,egress=1MB")
    grant = terms("tokens=5,wall=2h,cpu=2h,mem=64MiB,egress=10GB", 3_600_000, frozenset({"a.b"}))
    caps = worker_caps(SLOT, lease, None, grant, NOW)
    assert caps.budget.wall_ms == 60_000  # the slot
    assert caps.budget.cpu_ms == 20_000  # the lease
    assert caps.budget.mem_bytes == 64 * 2**20  # the grant
    assert caps.budget.egress_bytes == 1_000_000  # the lease
    assert caps.egress.destinations == ("a.b",)


def test_the_wall_clock_ends_at_the_first_expiry() -> None:
    lease = Budget.parse("tokens=0,wall=1h,cpu=1h,mem=1GiB,egress=0")
    grant = terms("tokens=0,wall=1h,cpu=1h,mem=1GiB,egress=0", 40_000)
    assert worker_caps(SLOT, lease, None, grant, NOW).budget.wall_ms == 40_000
    assert worker_caps(SLOT, lease, NOW + 7_000, grant, NOW).budget.wall_ms == 7_000
    assert worker_caps(SLOT, lease, NOW + 7_000, grant, NOW).deadline_ms == NOW + 7_000


def test_an_expired_or_spent_lease_is_refused() -> None:
    lease = Budget.parse("tokens=0,wall=1h,cpu=1h,mem=1GiB,egress=0")
    grant = terms("tokens=0,wall=1h,cpu=1h,mem=1GiB,egress=0", 40_000)
    with pytest.raises(LeaseSpentError) as expired:
        worker_caps(SLOT, lease, NOW, grant, NOW)
    assert expired.value.reason == "lease-spent"
    spent = Budget(tokens=0, wall_ms=3_600_000, cpu_ms=0, mem_bytes=2**30, egress_bytes=0)
    with pytest.raises(LeaseSpentError):
        worker_caps(SLOT, spent, None, grant, NOW)
