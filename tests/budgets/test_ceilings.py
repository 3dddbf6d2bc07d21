"""Fabric ceilings: enforced from the registry, and failing OPEN (journaled) when the
registry cannot be read; budgets stay fail-closed either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from charter.authority import FixedPolicy, Verdict
from charter.budgets import (
    CeilingCheckFailedOpen,
    DepthCeilingError,
    InsufficientBudgetError,
    PopulationCeilingError,
    RegistryFacts,
)
from charter.control import RegistryRead, SpawnService
from charter.core import KeyStore
from charter.ledger import Journal

from ._support import ROOT_BUDGET, ceiling, intent, register_root

COST = ROOT_BUDGET.split(100)


def _service(journal: Journal, keys: KeyStore, read: RegistryRead) -> SpawnService:
    return SpawnService(
        journal, keystore=keys, policy=FixedPolicy(Verdict.POSITIVE), read_registry=read
    )


def _registry(population_ceiling: int, depth_ceiling: int, live: int) -> RegistryRead:
    return lambda: RegistryFacts(
        population_ceiling=population_ceiling, depth_ceiling=depth_ceiling, live_population=live
    )


def _broken_registry() -> RegistryFacts:
    raise ConnectionError("registry projection unreachable")


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    j = Journal.create(f"sqlite:///{tmp_path / 'j.db'}")
    register_root(j, KeyStore(tmp_path / "home"), "root", ceiling())
    return j


def test_population_ceiling_refuses_and_is_journaled(journal: Journal, tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "home")
    svc = _service(journal, keys, _registry(10, 8, live=9))
    root = svc.durable_caller("root")
    svc.spawn(root, intent(1, COST))  # positive control: 9 + 1 fits
    with pytest.raises(PopulationCeilingError):
        svc.spawn(root, intent(2, COST))
    reasons = [e.event.reason for e in journal.entries(types=("SpawnRefused",))]
    assert reasons == ["population-ceiling"]


def test_depth_ceiling_refuses(journal: Journal, tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "home")
    svc = _service(journal, keys, _registry(1000, 1, live=0))
    root = svc.durable_caller("root")
    worker = root.child(svc.spawn(root, intent(1, COST)).children[0])  # depth 1: allowed
    with pytest.raises(DepthCeilingError):
        svc.spawn(worker, intent(1, COST.split(4)))  # depth 2: over the ceiling
    assert [e.event.reason for e in journal.entries(types=("SpawnRefused",))] == ["depth-ceiling"]


def test_registry_read_error_fails_open_and_the_journal_says_so(
    journal: Journal, tmp_path: Path
) -> None:
    keys = KeyStore(tmp_path / "home")
    svc = _service(journal, keys, _broken_registry)
    result = svc.spawn(svc.durable_caller("root"), intent(2, COST))
    assert len(result.children) == 2  # it went ahead
    (entry,) = journal.entries(types=("CeilingCheckFailedOpen",))
    assert isinstance(entry.event, CeilingCheckFailedOpen)
    assert entry.event.fanout == result.fanout_id
    assert "unreachable" in entry.event.error
    # ... in the fan-out's own append, not as an afterthought
    assert result.positions[0] <= entry.position <= result.positions[1]


def test_budgets_stay_fail_closed_when_the_registry_fails(journal: Journal, tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "home")
    svc = _service(journal, keys, _broken_registry)
    root = svc.durable_caller("root")
    svc.spawn(root, intent(1, ROOT_BUDGET.split(2)))  # leases half the root's budget
    with pytest.raises(InsufficientBudgetError):
        svc.spawn(root, intent(1, ROOT_BUDGET))
