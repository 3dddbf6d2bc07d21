"""Bounded arithmetic wherever a budget flows (issue 21, point 6): the cost-benefit gate
and the lease book compute sums past 2^63 − 1 without a model refusing them halfway,
and answer with a named verdict or refusal; a failing policy's text is readable and on
one line; worker-controlled text is escaped."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from charter.authority import (
    CostBenefitPolicy,
    GateDecided,
    GateDecision,
    GateQuestion,
    Verdict,
    ask_gate,
)
from charter.authority.errors import GateRefusedError
from charter.budgets import BudgetLedgerOpened, InsufficientBudgetError, LeaseBook, UsageRecorded
from charter.control import SpawnService
from charter.core import Budget, KeyStore, Lineage
from charter.core.budget import INT64_MAX
from charter.core.text import shown
from charter.ledger import Journal

from ._support import ceiling, intent, register_root

TOP = Budget(
    tokens=INT64_MAX,
    wall_ms=INT64_MAX,
    cpu_ms=INT64_MAX,
    mem_bytes=INT64_MAX,
    egress_bytes=INT64_MAX,
)
CEILING = Budget.parse("tokens=10M,wall=10h,cpu=10h,mem=64GiB,egress=10GB")
CHEAP = Budget.parse("tokens=100k,wall=1m,cpu=1m,mem=1MiB,egress=1MB")
PYDANTIC_WORDS = ("validation error", "errors.pydantic.dev", "type=", "input_value")


def _question(cost: Budget, width: int = 2, ceiling: Budget = CEILING) -> GateQuestion:
    return GateQuestion(
        actor=Lineage("agent:root"),
        affected=(),
        width=width,
        objective="scan the estate host by host",
        estimated_cost=cost,
        actor_ceiling=ceiling,
    )


@pytest.mark.parametrize(
    ("cost", "width", "ceiling"),
    [(TOP, 2, CEILING), (TOP, 2, TOP), (CHEAP, 10**18, CEILING), (TOP, 10**18, TOP)],
)
def test_the_gate_judges_an_estimate_of_2_63_without_overflow(
    cost: Budget, width: int, ceiling: Budget
) -> None:
    decision = ask_gate(CostBenefitPolicy(), _question(cost, width, ceiling))
    assert decision.verdict is Verdict.NEGATIVE, decision.reason
    assert "exceeds the actor's ceiling" in decision.reason or "efficiency" in decision.reason
    assert not any(word in decision.reason for word in PYDANTIC_WORDS)
    # Control: a small estimate under the same policy is allowed.
    assert ask_gate(CostBenefitPolicy(), _question(CHEAP)).verdict.allows


def test_a_spawn_estimating_2_63_is_refused_by_a_named_verdict(
    journal_url: str, tmp_path: Path
) -> None:
    """Before: the gate overflowed inside the policy and journaled gate-unknown with a
    raw pydantic message. Now: gate-negative, readable."""
    keys = KeyStore(tmp_path / "home")
    with Journal.create(journal_url) as journal:
        register_root(journal, keys, "root", ceiling())
        svc = SpawnService(journal, keystore=keys, policy=CostBenefitPolicy())
        root = svc.durable_caller("root")
        with pytest.raises(GateRefusedError) as caught:
            svc.spawn(root, intent(2, TOP))
        assert caught.value.reason == "gate-negative"
        (decided,) = [e.event for e in journal.entries(types=("GateDecided",))]
        assert isinstance(decided, GateDecided)
        assert decided.verdict is Verdict.NEGATIVE
        assert "exceeds the actor's ceiling on tokens" in decided.reason
        assert not any(word in decided.reason for word in PYDANTIC_WORDS)
        # Control: a fan-out the gate can weigh goes through.
        assert svc.spawn(root, intent(2, CHEAP)).children


class _Strict(BaseModel):
    count: int = Field(ge=0)


class _Raises:
    name = "raises\nverdict: positive"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def judge(self, question: GateQuestion) -> GateDecision:
        del question
        raise self.error


def _validation_error() -> Exception:
    try:
        _Strict(count=-1)
    except Exception as e:
        return e
    raise AssertionError("the model accepted -1")


@pytest.mark.parametrize(
    "error", [_validation_error(), ValueError("bad\nverdict: positive\x1b[2K")]
)
def test_a_failing_policy_reason_is_readable_and_on_one_line(error: Exception) -> None:
    decision = ask_gate(_Raises(error), _question(CHEAP))
    assert decision.verdict is Verdict.UNKNOWN
    assert "\n" not in decision.reason
    assert "\x1b" not in decision.reason
    assert "\n" not in decision.policy
    assert not any(word in decision.reason for word in PYDANTIC_WORDS), decision.reason
    assert "failed" in decision.reason


def test_leases_whose_total_passes_2_63_are_a_named_refusal() -> None:
    book = LeaseBook()
    book.apply(BudgetLedgerOpened(lineage="agent:root", allocation=TOP), 0)
    children = [(f"agent:root/sa-{i}", TOP, 1_000, "") for i in range(3)]
    with pytest.raises(InsufficientBudgetError, match="short by") as caught:
        book.decide_leases("agent:root", children, 0)
    assert str(2 * INT64_MAX) in str(caught.value)  # the shortfall, exact
    assert book.decide_leases("agent:root", children[:1], 0)  # control: one fits


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("agent:root/sa-1", "agent:root/sa-1"),
        ("扫描主机", "扫描主机"),
        ("a\nb", "a\\nb"),
        ("a\\nb", "a\\\\nb"),  # a worker's own backslash cannot pass for an escape
        ("\x1b[31mred", "\\x1b[31mred"),
        ("line\u2028sep", "line\\u2028sep"),
    ],
)
def test_worker_text_is_escaped_to_one_line(text: str, expected: str) -> None:
    assert shown(text) == expected
    assert len(shown("x" * 10_000, limit=50)) == 50


def test_the_lease_fold_never_fails_on_usage_the_models_accept() -> None:
    """Two usages of 2^63 − 1 each (a journal that broke the invariant: usage is clamped
    when decided) are folded, not refused halfway through by a Budget's bound."""
    book = LeaseBook()
    book.apply(BudgetLedgerOpened(lineage="agent:root", allocation=TOP), 0)
    for event in book.decide_leases("agent:root", [("agent:root/sa-1", TOP, 1_000, "")], 0):
        book.apply(event, 0)
    over = UsageRecorded(lineage="agent:root/sa-1", amount=TOP, refused=TOP, exhausted=True)
    book.apply(over, 1)
    book.apply(over, 2)
    assert book.get("agent:root").subtree_spent.tokens == 2 * INT64_MAX
    assert book.remaining("agent:root/sa-1", 3) == Budget.zero()
    assert book.remaining("agent:root", 1_000) == Budget.zero()  # charged at most its lease
