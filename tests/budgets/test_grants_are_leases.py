"""A child's grant is its lease, a grant's fan-out bounds its whole subtree, authority
is read from the signed bytes, and the fabric ceilings meet every spawn alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from charter.authority import FanoutExhaustedError
from charter.budgets import LeaseGranted as Lease
from charter.budgets import PopulationCeilingError, RegistryFacts
from charter.control import BudgetService, Caller, SpawnService
from charter.core import Budget, KeyStore
from charter.core.framing import grant_digest
from charter.ledger import Journal
from tests.invariants import check_history, journal_history

from ._support import ceiling, intent, register_root, service

COST = Budget.parse("tokens=300k,wall=30m,cpu=10m,mem=3GiB,egress=30MB")


@pytest.fixture
def journal(journal_url: str, tmp_path: Path) -> Journal:
    j = Journal.create(journal_url)
    register_root(j, KeyStore(tmp_path / "home"), "root", ceiling(fanout=30))
    return j


def test_a_child_grant_says_exactly_what_its_lease_does(journal: Journal, tmp_path: Path) -> None:
    svc = service(journal, KeyStore(tmp_path / "home"))
    root = svc.durable_caller("root")
    result = svc.spawn(root, intent(3, COST, fanout=5))
    (lease,) = list(journal.entries(types=("LeaseGranted",)))
    event = lease.event
    assert isinstance(event, Lease)
    assert event.fanout == result.fanout_id
    for child, digest in zip(result.children, event.grants, strict=True):
        terms = child.sealed.grant.terms  # the signed bytes, parsed
        assert terms.budget == event.allocation == COST.split(3)
        assert terms.expires_at_ms == event.expires_at_ms
        assert digest == grant_digest(child.sealed.body, child.sealed.signature).hex()
    # A worker's own fan-out is judged against its grant, which is its lease.
    worker = root.child(result.children[0])
    assert worker.chain[-1].grant.terms.budget == COST.split(3)


def test_a_root_with_fan_out_30_never_has_more_than_30_descendants(
    journal: Journal, tmp_path: Path
) -> None:
    svc = service(journal, KeyStore(tmp_path / "home"))
    budgets = BudgetService(journal)
    frontier: list[Caller] = [svc.durable_caller("root")]
    refused = 0
    while frontier:
        caller = frontier.pop()
        for width in (3, 2, 1):  # every caller tries to spawn as much as it can
            cost = budgets.remaining(caller.claimed).split(4)  # budget is never the limit
            try:
                result = svc.spawn(caller, intent(width, cost, fanout=30))
            except FanoutExhaustedError:
                refused += 1
                continue
            frontier += [caller.child(c) for c in result.children]
    minted = list(journal.entries(types=("GrantMinted",)))
    descendants = len(minted) - 1  # the root's own ceiling grant is minted too
    assert 0 < descendants <= 30
    assert refused > 0  # the bound was reached, not merely approached
    assert check_history(journal_history(journal)).problems == []


def test_a_chain_presented_with_a_widened_parse_is_refused(
    journal: Journal, tmp_path: Path
) -> None:
    """The caller's chain objects carry the real bytes and signatures but a parsed grant
    that says more: the service re-reads the signed bytes, so the widened parse buys
    nothing (the child is minted from what was signed)."""
    svc = service(journal, KeyStore(tmp_path / "home"))
    root = svc.durable_caller("root")
    worker = root.child(svc.spawn(root, intent(1, COST, fanout=2)).children[0])
    sealed = worker.chain[-1]
    real = sealed.grant
    wide_terms = real.terms.model_copy(update={"fanout": 1000, "budget": COST, "depth": 6})
    wide = real.model_copy(update={"terms": wide_terms})
    assert sealed.__pydantic_private__ is not None
    sealed.__pydantic_private__["_grant"] = wide  # the parse lies; the bytes do not
    assert worker.chain[-1].grant.terms.fanout == 1000
    with pytest.raises(FanoutExhaustedError):
        svc.spawn(worker, intent(3, COST.split(100)))  # 3 > the signed fan-out of 2
    result = svc.spawn(worker, intent(2, COST.split(100)))  # within the signed terms
    for child in result.children:
        assert child.grant.terms.budget.fits_within(real.terms.budget)
        assert child.grant.terms.depth < real.terms.depth


def test_a_workers_fan_out_meets_the_population_ceiling_as_an_operators_does(
    journal: Journal, tmp_path: Path
) -> None:
    keys = KeyStore(tmp_path / "home")
    ceilings_at = {"live": 0}

    def registry() -> RegistryFacts:
        return RegistryFacts(
            population_ceiling=4, depth_ceiling=8, live_population=ceilings_at["live"]
        )

    svc = SpawnService(journal, keystore=keys, policy=service(journal, keys).policy,
                       read_registry=registry)  # fmt: skip
    root = svc.durable_caller("root")
    worker = root.child(svc.spawn(root, intent(2, COST, fanout=5)).children[0])
    ceilings_at["live"] = 2
    svc.spawn(worker, intent(2, COST.split(100)))  # 2 + 2 = 4: at the ceiling, allowed
    ceilings_at["live"] = 4
    with pytest.raises(PopulationCeilingError):
        svc.spawn(worker, intent(1, COST.split(100)))  # a worker's fan-out: refused
    with pytest.raises(PopulationCeilingError):
        svc.spawn(root, intent(1, COST.split(100)))  # the operator's: refused alike
    refused = [e.event for e in journal.entries(types=("SpawnRefused",))]
    assert [(r.actor, r.reason) for r in refused] == [  # type: ignore[attr-defined]
        (str(worker.chain[-1].grant.lineage), "population-ceiling"),
        ("agent:root", "population-ceiling"),
    ]
