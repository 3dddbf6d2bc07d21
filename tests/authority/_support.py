"""Helpers for the authority tests: grants, strategies and journal readers."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import strategies as st
from nacl.signing import SigningKey

from charter.authority import (
    Clearance,
    Grant,
    GrantTerms,
    PermissionMode,
    RequestedGrant,
    SealedGrant,
    SpawnIntent,
    SpawnRefused,
    seal,
)
from charter.core import Budget, Lineage
from charter.ledger import Journal

FAR_FUTURE_MS = 4_000_000_000_000
NOW_MS = 1_700_000_000_000

BIG = Budget.parse("tokens=100M,wall=10h,cpu=10h,mem=64GiB,egress=10GB")
COST = Budget.parse("tokens=2M,wall=10m,cpu=10m,mem=1GiB,egress=10MB")
SMALL_COST = COST.split(64)  # a fan-out's default estimate: leaves each lease room to nest


def terms(**over: object) -> GrantTerms:
    base: dict[str, object] = {
        "tools": frozenset({"Read", "Bash", "Edit"}),
        "egress": frozenset({"*.example.com", "api.other.org"}),
        "secrets": frozenset({"GITHUB_TOKEN"}),
        "clearance": Clearance.CONFIDENTIAL,
        "mode": PermissionMode.ACCEPT_EDITS,
        "depth": 3,
        "fanout": 2000,
        "budget": BIG,
        "expires_at_ms": FAR_FUTURE_MS,
    }
    base.update(over)
    return GrantTerms(**base)  # type: ignore[arg-type]


def root_grant(key: SigningKey, name: str = "root", t: GrantTerms | None = None) -> SealedGrant:
    lineage = Lineage.root(name)
    grant = Grant(
        lineage=lineage,
        issuer=lineage,
        subject_key=bytes(key.verify_key).hex(),
        parent_digest=None,
        issued_at_ms=NOW_MS - 1000,
        terms=t or terms(),
    )
    return seal(grant, key)


def intent(
    width: int = 3,
    objective: str = "review every module of the codebase",
    cost: Budget = SMALL_COST,
    **grant: object,
) -> SpawnIntent:
    # Workers fan out only as far as their intent asks (carved out of the parent's
    # allowance): these tests ask for some, so their workers may spawn in turn.
    grant.setdefault("fanout", 10)
    return SpawnIntent(
        width=width,
        objective=objective,
        grant=RequestedGrant(**grant),  # type: ignore[arg-type]
        estimated_cost=cost,
    )


def refusals(journal: Journal) -> list[SpawnRefused]:
    return [
        e.event
        for e in journal.entries(types=("SpawnRefused",))
        if isinstance(e.event, SpawnRefused)
    ]


def entries_of(journal: Journal, *types: str) -> Iterator[object]:
    for e in journal.entries(types=types):
        yield e.event


# -- hypothesis strategies ----------------------------------------------------------

TOOLS = ["Read", "Write", "Bash", "Edit", "Grep", "WebFetch", "mcp:github"]
SECRETS = ["GITHUB_TOKEN", "NPM_TOKEN", "AWS_KEY", "DB_URL"]
DESTINATIONS = [
    "example.com",
    "api.example.com",
    "*.example.com",
    "*.api.example.com",
    "x.api.example.com",
    "pypi.org",
    "*.pypi.org",
    "files.pypi.org",
    "*.org",
    "other.org",
]

tool_sets = st.frozensets(st.sampled_from(TOOLS))
secret_sets = st.frozensets(st.sampled_from(SECRETS))
egress_sets = st.frozensets(st.sampled_from(DESTINATIONS), max_size=5)
budgets = st.builds(
    Budget,
    tokens=st.integers(0, 10**9),
    wall_ms=st.integers(0, 10**8),
    cpu_ms=st.integers(0, 10**8),
    mem_bytes=st.integers(0, 2**40),
    egress_bytes=st.integers(0, 2**40),
)
grant_terms = st.builds(
    GrantTerms,
    tools=tool_sets,
    egress=egress_sets,
    secrets=secret_sets,
    clearance=st.sampled_from(list(Clearance)),
    mode=st.sampled_from(list(PermissionMode)),
    depth=st.integers(1, 6),
    fanout=st.integers(1, 50),
    budget=budgets,
    expires_at_ms=st.integers(NOW_MS + 1, FAR_FUTURE_MS),
)
requested_grants = st.builds(
    RequestedGrant,
    tools=st.none() | tool_sets,
    egress=st.none() | egress_sets,
    secrets=st.none() | secret_sets,
    clearance=st.none() | st.sampled_from(list(Clearance)),
    mode=st.none() | st.sampled_from(list(PermissionMode)),
    depth=st.none() | st.integers(0, 64),
    fanout=st.none() | st.integers(0, 10_000),
    budget=st.none() | budgets,
    ttl_s=st.none() | st.integers(1, 366 * 86_400),
)
