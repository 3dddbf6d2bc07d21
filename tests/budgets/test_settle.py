"""Settling a quiet journal (both backends): a child's expiry after the last commit is not
final until the journal commits past it, so a decision that needs the budget it held
commits one ``BudgetSettled`` entry first, and a decision that fits without it commits
none (settling costs a commit, paid only when it changes the answer). A fan-out that
needs it pins the journal's head instead (docs/decisions-and-views.md), and settles only
once that pin lost (or with the pin switched off, as here to show the settle alone)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from charter.control import BudgetService, Caller, SpawnService
from charter.control.resources import Settling
from charter.core import Budget, KeyStore, now_ms
from charter.ledger import Journal
from tests.invariants import check_history, journal_history

from ._support import a_root_and_a_child, ceiling, intent, register_root, service

ROOT = Budget.parse("tokens=100k,wall=10h,cpu=10h,mem=64GiB,egress=10GB")
BRIEF = Budget.parse("tokens=40k,wall=1s,cpu=1m,mem=1GiB,egress=0")
LATER = Budget.parse("tokens=60k,wall=1m,cpu=1m,mem=1GiB,egress=0")


def _settles(journal: Journal) -> int:
    return len(list(journal.entries(types=("BudgetSettled",))))


def _after_a_quiet_expiry(url: str, home: Path) -> tuple[Journal, SpawnService, Caller]:
    brief = a_root_and_a_child(url, home, ROOT, BRIEF)
    while now_ms() <= brief.expires_ms:  # nothing commits meanwhile: a quiet journal
        time.sleep(0.01)
    return brief.journal, brief.svc, brief.root


def test_a_fan_out_that_fits_beside_a_recent_expiry_settles_nothing(
    journal_url: str, tmp_path: Path
) -> None:
    journal, svc, root = _after_a_quiet_expiry(journal_url, tmp_path / "home")
    with journal:
        svc.spawn(root, intent(1, LATER))  # 60k beside 40k
        assert _settles(journal) == 0
        assert check_history(journal_history(journal)).problems == []


def test_a_fan_out_that_needs_the_expired_budget_pins_the_head_and_settles_nothing(
    journal_url: str, tmp_path: Path
) -> None:
    journal, svc, root = _after_a_quiet_expiry(journal_url, tmp_path / "home")
    with journal:
        head = journal.head()
        whole = LATER.model_copy(update={"tokens": 100_000})
        result = svc.spawn(root, intent(1, whole))  # the child's too
        assert head is not None
        assert result.positions[0] == head[0] + 1  # right after what it read
        assert _settles(journal) == 0
        assert check_history(journal_history(journal)).problems == []


def test_a_fan_out_that_needs_the_expired_budget_settles_a_quiet_journal_once(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Settling, "pin_head", False)  # the fallback after a lost pin, alone
    journal, svc, root = _after_a_quiet_expiry(journal_url, tmp_path / "home")
    with journal:
        whole = LATER.model_copy(update={"tokens": 100_000})
        svc.spawn(root, intent(1, whole))  # the child's too
        assert _settles(journal) == 1
        assert check_history(journal_history(journal)).problems == []


def test_a_usage_that_needs_an_expired_childs_budget_settles_a_quiet_journal(
    journal_url: str, tmp_path: Path
) -> None:
    """Without settling it would be clamped to what it holds beside the child (60k)."""
    keys = KeyStore(tmp_path / "home")
    with Journal.create(journal_url) as journal:
        register_root(journal, keys, "root", ceiling(ROOT))
        svc = service(journal, keys)
        root = svc.durable_caller("root")
        whole = Budget.parse("tokens=100k,wall=1m,cpu=1m,mem=2GiB,egress=0")
        parent = root.child(svc.spawn(root, intent(1, whole)).children[0])
        grandchild = str(svc.spawn(parent, intent(1, BRIEF)).children[0].lineage)
        expires = svc.resources.book.get(grandchild).expires_at_ms or 0
        while now_ms() <= expires:  # nothing commits meanwhile: a quiet journal
            time.sleep(0.01)
        wanted = Budget.parse("tokens=70k,wall=0s,cpu=0s,mem=0B,egress=0B")
        assert BudgetService(journal).record_usage(parent.claimed, wanted).amount == wanted
        assert _settles(journal) == 1
        assert check_history(journal_history(journal)).problems == []
