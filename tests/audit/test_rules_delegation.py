"""``sandbox: own`` delegation (docs/delegation.md) as an audit rule (``delegation``,
docs/VERIFYING.md §9): a delegation journaled after its reservation or twice, by a
delegate, reserved out of another lease than its caller's, a delegate started after its
reply, a reply never requested, twice, to another caller or before the delegate ended.
The history is the product's (a worker's delegation through the one pipeline, and the
refusals it journals); the tampered entries are appended past the control layer,
validly chained, as an attacker with write access would. SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

import charter.catalogue  # noqa: F401  (registers every event type)
from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import LeaseGranted
from charter.control import (
    Ceiling,
    DelegationReplied,
    DelegationRequested,
    NestedDelegationError,
    NotOwnSandboxError,
)
from charter.core import Budget, KeyStore
from charter.ledger import Journal
from charter.runner.events import WorkerEnded, WorkerStarted
from tests.audit.test_semantic import _append, _audit, _only
from tests.invariants import check_delegations, journal_history

RESERVE = Budget.parse("tokens=10k,wall=1m,cpu=1m,mem=64MiB,egress=1MB")
CEILING = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB")


@pytest.fixture
def delegated(journal_url: str, tmp_path: Path) -> tuple[str, str, str]:
    """A product history: a worker of ``estate`` that delegated to own-sandbox agent
    ``helper`` (its delegate scheduled, not run), and the refusals of a nested
    delegation and of one to an agent with no own sandbox. (url, caller, delegate)."""
    charter, _ = Charter.initialise(
        journal_url, root="estate", ceiling=Ceiling(budget=CEILING),
        cell=CellSetup(cores=8, reserve=1), keys=KeyStore(tmp_path / "home"),
        settings=Settings(),
    )  # fmt: skip
    with charter:
        charter.add_agent(
            "helper", Ceiling(budget=CEILING, depth=1),
            own_sandbox=("/bin/echo", "hi"), delegate_budget=RESERVE,
        )  # fmt: skip
        root = charter.spawn_service().durable_caller("estate")
        intent = SpawnIntent(
            width=1, objective="a worker that delegates to its helper",
            estimated_cost=Budget.parse("tokens=100k,wall=10m,cpu=10m,mem=1GiB,egress=10MB"),
        )  # fmt: skip
        fanout = charter.spawn(root, intent, policy=FixedPolicy(Verdict.POSITIVE))
        worker = root.child(fanout.children[0])
        result = charter.delegate(worker, "helper", ("do it",))
        delegate = root.child(result.children[0])  # as its door would resolve it
        with pytest.raises(NestedDelegationError):
            charter.delegate(delegate, "helper")
        with pytest.raises(NotOwnSandboxError):
            charter.delegate(worker, "estate")
    caller, lineage = worker.claimed, delegate.claimed
    report = _audit(journal_url)
    assert report.ok, report.findings  # positive control: the product's history is clean
    assert _independent(journal_url) == []  # and by the independent fold
    return journal_url, caller, lineage


def _independent(url: str) -> list[str]:
    """What the independent fold (tests/invariants.py) finds in the history."""
    with Journal.open(url) as journal:
        return check_delegations(journal_history(journal)).problems


def _requested(caller: str, delegate: str) -> DelegationRequested:
    return DelegationRequested(
        fanout="f" * 32, caller=caller, agent="helper", delegate=delegate, reserved=RESERVE
    )


def _replied(caller: str, delegate: str) -> DelegationReplied:
    return DelegationReplied(caller=caller, delegate=delegate, outcome="exited")


def test_a_delegation_after_its_reservation_or_twice_is_found(
    delegated: tuple[str, str, str],
) -> None:
    url, caller, delegate = delegated
    (again,) = _append(url, _requested(caller, delegate))
    (leased_first,) = _append(url, _requested(caller, caller))  # the caller holds a ledger
    assert _only(_audit(url), "delegation") == [again, leased_first]


def test_a_delegate_that_delegates_is_found(delegated: tuple[str, str, str]) -> None:
    url, _caller, delegate = delegated
    (nested,) = _append(url, _requested(delegate, "agent:helper/sa-9"))
    assert _only(_audit(url), "delegation") == [nested]
    assert [p.split(":")[0] for p in _independent(url)] == [str(nested)]


def test_a_reservation_out_of_another_lease_is_found(delegated: tuple[str, str, str]) -> None:
    url, caller, _delegate = delegated
    fresh = "agent:helper/sa-7"
    _append(url, _requested(caller, fresh))
    (lease,) = _append(
        url,
        LeaseGranted(
            fanout="g" * 32, parent="agent:estate", lineages=(fresh,), allocation=RESERVE,
            expires_at_ms=2**40,
        ),
    )  # fmt: skip
    assert _only(_audit(url), "delegation") == [lease]
    assert [p.split(":")[0] for p in _independent(url)] == [str(lease)]


def test_replies_out_of_order_are_found(delegated: tuple[str, str, str]) -> None:
    url, caller, delegate = delegated
    (never,) = _append(url, _replied(caller, "agent:helper/sa-8"))
    (early,) = _append(url, _replied(caller, delegate))  # it has not ended
    (twice,) = _append(url, _replied(caller, delegate))
    (started,) = _append(
        url, WorkerStarted(lineage=delegate, cell="local", incarnation=1, sandbox_id="s" * 16)
    )
    assert _only(_audit(url), "delegation") == [never, early, twice, started]
    found = {int(p.split(":")[0]) for p in _independent(url)}
    assert found == {never, early, twice, started}


def test_a_reply_after_the_end_to_its_caller_is_clean_and_to_another_is_found(
    delegated: tuple[str, str, str],
) -> None:
    url, caller, delegate = delegated
    _append(url, WorkerEnded(lineage=delegate, outcome="killed", reason="never started"))
    (other,) = _append(url, _replied("agent:estate", delegate))
    _append(url, _replied(caller, delegate))  # positive control: after its end, its caller
    assert _only(_audit(url), "delegation") == [other]
