"""The fan-out's head pin, as a decision uses it (docs/decisions-and-views.md): a fan-out
that needs the budget of a child whose lease ended after the last commit it read takes
that end as final only with its append pinned to the journal's head as it read it
(``expect_head``) and to a commit time at or after the end (``not_before_ms``). Shown on
both backends, each case checked by the independent fold (tests/invariants.py):

- anything committed between the fan-out's read and its append makes the pin lose; the
  fan-out is decided again on the journal as it is then (here the entry that landed is
  itself past the child's end, so the decision needs no pin the second time);
- a commit stamped before the child's end (the fan-out's clock runs ahead of the
  journal's) is refused by the pin; the fallback settles the journal, which does not
  settle it either, and the fan-out is refused. The control drops ``not_before_ms``:
  the fan-out commits before the child's end in journal time, the child (still live)
  spends, and the fold finds the root overspent.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from charter.authority import FixedPolicy, Verdict
from charter.control import BudgetService, SpawnService
from charter.core import Budget, KeyStore, RefusedError, now_ms
from charter.ledger import HeadPinLostError, Journal
from tests.invariants import check_history, journal_history
from tests.journal._support import Ping

from ._support import a_root_and_a_child, ceiling, intent, register_root, watch_fan_outs

ROOT = Budget.parse("tokens=100k,wall=10h,cpu=10h,mem=64GiB,egress=10GB")
BRIEF = Budget.parse("tokens=100k,wall=2s,cpu=1h,mem=1GiB,egress=1GB")  # ends in ~2 s
LATER = Budget.parse("tokens=100k,wall=1m,cpu=1m,mem=1GiB,egress=0")
SPENT = Budget.parse("tokens=100k,wall=0s,cpu=0s,mem=0B,egress=0B")
AHEAD_MS = 3_000  # how far the fan-out's clock runs ahead of the journal's
LONGER = Budget.parse("tokens=100k,wall=4s,cpu=1h,mem=1GiB,egress=1GB")  # ends in ~4 s


def _until(ms: int) -> None:
    while now_ms() < ms:  # a wall-clock instant the scenario is built around
        time.sleep(0.005)


@pytest.mark.slow
def test_anything_committed_between_read_and_append_makes_the_pin_lose(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    brief = a_root_and_a_child(journal_url, tmp_path / "home", ROOT, BRIEF)
    journal = brief.journal
    landed: list[int] = []

    def unrelated_commit() -> None:
        with Journal.open(journal_url) as other:
            landed.append(other.append([Ping(writer="other", batch=0, n=0)])[0].position)

    tries = watch_fan_outs(monkeypatch, unrelated_commit)
    _until(brief.expires_ms + 300)  # just after the child's end, nothing committed since
    with journal:
        result = brief.svc.spawn(brief.root, intent(1, LATER))
        assert len(tries) == 2
        assert tries[0][0] == landed[0] - 1  # pinned to the head it read, then lost
        assert tries[0][1] == brief.expires_ms  # and to a commit at or after the end
        assert tries[1] == (None, None)  # decided again: the entry that landed settled it
        assert result.positions[0] > landed[0]
        assert not list(journal.entries(types=("BudgetSettled",)))
        found = check_history(journal_history(journal))
        assert found.problems == []


def _ahead(journal_url: str, home: Path) -> tuple[Journal, SpawnService, Any, str, int]:
    """A root whose spawn service's clock runs AHEAD_MS ahead, and a child it leased."""
    keys = KeyStore(home)
    journal = Journal.create(journal_url)
    register_root(journal, keys, "root", ceiling(ROOT))
    svc = SpawnService(
        journal,
        keystore=keys,
        policy=FixedPolicy(Verdict.POSITIVE),
        clock=lambda: now_ms() + AHEAD_MS,
    )
    root = svc.durable_caller("root")
    child = str(svc.spawn(root, intent(1, LONGER)).children[0].lineage)
    return journal, svc, root, child, svc.resources.book.get(child).expires_at_ms or 0


def _race_ahead(journal_url: str, home: Path) -> tuple[Journal, bool, str]:
    """The fan-out decided when its clock is past the child's end but the journal's is
    not; then the child spends its whole lease (by the journal's clock, still live)."""
    journal, svc, root, child, expires = _ahead(journal_url, home)
    _until(expires - AHEAD_MS + 200)  # the fan-out's clock: 200 ms past the end
    try:
        svc.spawn(root, intent(1, LATER))
        minted = True
    except RefusedError:
        minted = False
    assert now_ms() < expires - 1_000  # the journal's time is still well before the end
    BudgetService(journal).record_usage(child, SPENT)
    return journal, minted, child


@pytest.mark.slow
def test_a_commit_stamped_before_the_end_loses_the_pin_and_the_fallback_refuses(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost: list[str] = []
    append = Journal.append

    def watched(self: Journal, events: Any, **kwargs: Any) -> Any:
        try:
            return append(self, events, **kwargs)
        except HeadPinLostError as e:
            lost.append(str(e))
            raise

    monkeypatch.setattr(Journal, "append", watched)
    journal, minted, _ = _race_ahead(journal_url, tmp_path / "home")
    with journal:
        assert not minted  # refused: the child's end is not final in journal time
        assert len(lost) == 1
        assert "before" in lost[0]  # the not-before time, not the head
        assert len(list(journal.entries(types=("BudgetSettled",)))) == 1  # the fallback
        found = check_history(journal_history(journal))
        assert found.problems == []


@pytest.mark.slow
def test_control_without_the_not_before_time_the_fold_finds_the_overspend(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append = Journal.append

    def any_time(self: Journal, events: Any, **kwargs: Any) -> Any:
        kwargs.pop("not_before_ms", None)
        return append(self, events, **kwargs)

    monkeypatch.setattr(Journal, "append", any_time)
    journal, minted, _ = _race_ahead(journal_url, tmp_path / "home")
    with journal:
        assert minted  # committed before the child's end, which it took as final
        found = check_history(journal_history(journal))
        assert any(p.split(": ", 1)[1].startswith("agent:root uses ") for p in found.problems)
