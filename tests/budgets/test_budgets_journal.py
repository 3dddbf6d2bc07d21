"""Budgets on a real journal (SQLite and PostgreSQL): leases join fan-outs, refusals are
journaled, expiry returns budget with no process left to notice."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from charter.authority import SpawnRefused
from charter.budgets import (
    BudgetRefused,
    InsufficientBudgetError,
    LeaseEndedError,
    LeaseGranted,
    NoBudgetLedgerError,
    RenewalBeyondParentError,
)
from charter.control import BudgetService, SpawnService
from charter.core import Budget, CharterError, KeyStore, now_ms
from charter.ledger import Journal

from ._support import ROOT_BUDGET, ceiling, check_every_position, intent, register_root, service

ROOT_DIR = Path(__file__).resolve().parents[2]


def test_random_history_never_overspends_at_any_position(journal_url: str, tmp_path: Path) -> None:
    """Spawns, usage, releases and renewals through the real services, interleaved at
    random; then every journal position is checked."""
    rng = random.Random(4)
    keys = KeyStore(tmp_path / "home")
    with Journal.create(journal_url) as journal:
        register_root(journal, keys, "root", ceiling())
        svc = service(journal, keys)
        budgets = BudgetService(journal)
        callers = [svc.durable_caller("root")]
        refused = 0
        for _ in range(60):
            caller = rng.choice(callers)
            leaf = str(caller.chain[-1].grant.lineage)
            try:
                match rng.choice(["spawn", "spawn", "usage", "release", "renew"]):
                    case "spawn":
                        share = rng.randint(1, 150)  # sometimes more than the caller holds
                        held = budgets.remaining(leaf)
                        cost = Budget(**{a: getattr(held, a) * share // 100 for a in Budget.AXES})
                        result = svc.spawn(caller, intent(rng.randint(1, 3), cost))
                        callers += [caller.child(c) for c in result.children]
                    case "usage":
                        held = budgets.remaining(leaf)
                        budgets.record_usage(
                            leaf, Budget(**{a: getattr(held, a) // 3 for a in Budget.AXES})
                        )
                    case "release":
                        budgets.release(leaf)
                    case "renew":
                        budgets.renew(leaf, now_ms() + rng.randint(1_000, 50_000_000))
            except CharterError:
                refused += 1
        assert refused > 0  # the history did try to overspend, and was refused
        assert len(callers) > 5
        assert check_every_position(journal) > 20


def test_refusals_are_journaled_with_their_reason(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "home")
    with Journal.create(f"sqlite:///{tmp_path / 'j.db'}") as journal:
        register_root(journal, keys, "root", ceiling())
        register_root(journal, keys, "poor", ceiling(), budget_ledger=False)
        svc = service(journal, keys)
        budgets = BudgetService(journal)
        with pytest.raises(NoBudgetLedgerError):  # no ledger: fail closed
            svc.spawn(
                svc.durable_caller("poor"),
                intent(1, Budget.parse("tokens=1,wall=1s,cpu=1s,mem=1,egress=1")),
            )
        root = svc.durable_caller("root")
        with pytest.raises(InsufficientBudgetError):
            svc.spawn(root, intent(2, ROOT_BUDGET + ROOT_BUDGET))
        small = ROOT_BUDGET.split(10)
        child = str(svc.spawn(root, intent(1, small)).children[0].lineage)
        # the root's ledger does not expire, so renew a grandchild past its parent's lease
        worker = root.child(svc.spawn(root, intent(1, small)).children[0])
        grand = svc.spawn(worker, intent(1, small.split(4)))
        with pytest.raises(RenewalBeyondParentError):
            budgets.renew(str(grand.children[0].lineage), 2**62)
        budgets.release(child)
        with pytest.raises(LeaseEndedError):
            budgets.record_usage(child, small.split(2))
        spawn_reasons = {e.event.reason for e in journal.entries(types=("SpawnRefused",))}
        assert {"no-budget-ledger", "insufficient-budget"} <= spawn_reasons
        budget_reasons = {e.event.reason for e in journal.entries(types=("BudgetRefused",))}
        assert {"renewal-beyond-parent", "lease-ended"} <= budget_reasons
        assert all(
            isinstance(e.event, SpawnRefused | BudgetRefused)
            for e in journal.entries(types=("SpawnRefused", "BudgetRefused"))
        )


def test_leases_commit_in_the_fanout_append(
    tmp_path: Path,
) -> None:
    keys = KeyStore(tmp_path / "home")
    with Journal.create(f"sqlite:///{tmp_path / 'j.db'}") as journal:
        register_root(journal, keys, "root", ceiling())
        svc: SpawnService = service(journal, keys)
        result = svc.spawn(svc.durable_caller("root"), intent(4, ROOT_BUDGET.split(2)))
        (entry,) = journal.entries(types=("LeaseGranted",))  # one event for the fan-out
        lease = entry.event
        assert isinstance(lease, LeaseGranted)
        assert list(lease.lineages) == [str(c.lineage) for c in result.children]
        assert result.positions[0] <= entry.position <= result.positions[1]
        assert lease.allocation == ROOT_BUDGET.split(2).split(4)


def test_usage_decided_before_an_ancestor_release_does_not_commit_after_it(
    tmp_path: Path,
) -> None:
    """Releasing C ends its subtree and returns its budget; a usage of grandchild G
    decided just before must not land after that release (it would charge C again and
    let the root lease the same budget twice). The release races in between G's
    decision and its append; the usage is re-decided and refused."""
    keys = KeyStore(tmp_path / "home")
    with Journal.create(f"sqlite:///{tmp_path / 'j.db'}") as journal:
        register_root(journal, keys, "root", ceiling())
        svc = service(journal, keys)
        root = svc.durable_caller("root")
        half = ROOT_BUDGET.split(2)
        c = root.child(svc.spawn(root, intent(1, half)).children[0])
        g = str(svc.spawn(c, intent(1, half.split(2))).children[0].lineage)
        worker, operator = BudgetService(journal), BudgetService(journal)
        worker.record_usage(g, half.split(100))  # control: G may spend while C is live
        decide = worker.view.book.decide_usage
        racing = [c.claimed]

        def decide_then_race(*args: Any, **kwargs: Any) -> Any:
            event = decide(*args, **kwargs)
            while racing:
                operator.release(racing.pop())  # lands between decision and append
            return event

        worker.view.book.decide_usage = decide_then_race  # type: ignore[method-assign]
        with pytest.raises(LeaseEndedError):
            worker.record_usage(g, half.split(10))
        usages = [e.event for e in journal.entries(types=("UsageRecorded",))]
        assert len(usages) == 1  # only the control's
        assert check_every_position(journal) > 0


@pytest.mark.slow
def test_killed_worker_lease_expires_back_to_the_parent(journal_url: str, tmp_path: Path) -> None:
    """A worker holding a lease is SIGKILLed and never releases it. Once the lease's
    time is up, its unspent budget is back with the parent: no process noticed."""
    home = tmp_path / "home"
    with Journal.create(journal_url) as journal:
        register_root(journal, KeyStore(home), "root", ceiling())
    cost = "tokens=100k,wall=2s,cpu=2s,mem=1MiB,egress=1MB"  # the lease lasts 2 s
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.budgets._support", journal_url, str(home), cost],
        cwd=ROOT_DIR,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT_DIR)},
    )
    assert worker.stdout is not None
    child = worker.stdout.readline().decode().strip()
    assert child.startswith("agent:root/sa-"), "the worker did not get its lease"
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)
    with Journal.open(journal_url) as journal:
        budgets = BudgetService(journal)
        lease = next(e.event for e in journal.entries(types=("LeaseGranted",)))
        assert isinstance(lease, LeaseGranted)
        spent = Budget.parse("tokens=1k,wall=1s,cpu=1s,mem=0,egress=0")
        before = budgets.remaining("agent:root", at_ms=lease.expires_at_ms - 1)
        assert before == ROOT_BUDGET.saturating_sub(lease.allocation)  # still held
        # Wait (bounded) for the lease's own deadline to pass on the real clock.
        while now_ms() <= lease.expires_at_ms:
            time.sleep(0.05)
        assert budgets.remaining("agent:root") == ROOT_BUDGET.saturating_sub(spent)
        assert budgets.remaining(child) == Budget.zero()


def test_a_second_ledger_for_a_root_never_replaces_the_first(tmp_path: Path) -> None:
    """Only a database writer could append a second BudgetLedgerOpened for a root; the
    live book keeps the first allocation and its spend, as the auditor does."""
    from charter.budgets import BudgetLedgerOpened, LeaseBook, UsageRecorded

    first = Budget.parse("tokens=100k,wall=1h,cpu=1h,mem=1GiB,egress=1MB")
    spent = Budget.parse("tokens=60k,wall=0s,cpu=0s,mem=0B,egress=0B")
    book = LeaseBook()
    book.apply(BudgetLedgerOpened(lineage="agent:r", allocation=first), 0)
    zero = Budget.zero()
    book.apply(UsageRecorded(lineage="agent:r", amount=spent, refused=zero, exhausted=False), 1)
    assert book.remaining("agent:r", 2).tokens == 40_000  # control: the ledger is live
    forged = Budget.parse("tokens=1000000M,wall=1h,cpu=1h,mem=1GiB,egress=1MB")
    book.apply(BudgetLedgerOpened(lineage="agent:r", allocation=forged), 3)
    assert book.remaining("agent:r", 4).tokens == 40_000
