"""The gate: asked once per fan-out; fail closed; the default policy really judges."""

from __future__ import annotations

from typing import Any

import pytest

from charter.authority import (
    CostBenefitPolicy,
    GateDecision,
    GateQuestion,
    GrantMinted,
    Verdict,
    ask_gate,
    errors,
)
from charter.control import AgentRecord, SpawnService
from charter.core import Budget, KeyStore, Lineage
from charter.ledger import AppendConflictError, Journal
from tests.authority._support import BIG, intent

ACTOR = Lineage("agent:root")


def question(
    width: int, cost: str, objective: str = "review every module for bugs"
) -> GateQuestion:
    return GateQuestion(
        actor=ACTOR,
        affected=(ACTOR,),
        width=width,
        objective=objective,
        estimated_cost=Budget.parse(cost),
        actor_ceiling=Budget.parse("tokens=10M,wall=1h,cpu=1h,mem=8GiB,egress=1GB"),
    )


CHEAP = "tokens=1M,wall=10m,cpu=10m,mem=1GiB,egress=10MB"


@pytest.mark.parametrize(
    ("q", "verdict", "why"),
    [
        (question(10, CHEAP), Verdict.POSITIVE, "good efficiency"),
        (
            question(10, "tokens=20M,wall=10m,cpu=10m,mem=1GiB,egress=10MB"),
            Verdict.NEGATIVE,
            "exceeds the actor's ceiling on tokens",
        ),
        (question(1000, CHEAP), Verdict.NEGATIVE, "efficiency 0.33"),
        (question(200, CHEAP), Verdict.NEUTRAL, "efficiency 0.71"),
        (
            question(10, "tokens=6M,wall=10m,cpu=10m,mem=1GiB,egress=10MB"),
            Verdict.NEUTRAL,
            "a large bet",
        ),
        (
            question(10, "tokens=0,wall=0s,cpu=0s,mem=0,egress=0"),
            Verdict.UNKNOWN,
            "no cost estimate",
        ),
        (question(10, CHEAP, objective="do stuff"), Verdict.UNKNOWN, "too vague"),
        (
            question(1000, "tokens=0,wall=0s,cpu=0s,mem=0,egress=0", objective="x"),
            Verdict.UNKNOWN,
            "no cost estimate",
        ),
    ],
)
def test_default_policy_judges_from_its_inputs(q: GateQuestion, verdict: Verdict, why: str) -> None:
    decision = CostBenefitPolicy().judge(q)
    assert decision.verdict is verdict
    assert why in decision.reason
    assert decision.policy == "cost-benefit/v1"


def test_negative_outweighs_unknown_and_neutral() -> None:
    q = question(6000, "tokens=0,wall=0s,cpu=0s,mem=0,egress=0", objective="x")
    # Zero tokens and a vague objective: unknown; 6000 workers of overhead exceed the
    # ceiling: negative, which wins.
    assert CostBenefitPolicy().judge(q).verdict is Verdict.NEGATIVE


class Junk:
    name = "junk"

    def judge(self, q: GateQuestion) -> object:
        return "positive"


class Boom:
    name = "boom"

    def judge(self, q: GateQuestion) -> GateDecision:
        raise ValueError("no verdict today")


def test_a_raising_or_malformed_policy_counts_as_unknown() -> None:
    q = question(10, CHEAP)
    assert ask_gate(Boom(), q).verdict is Verdict.UNKNOWN
    assert "no verdict today" in ask_gate(Boom(), q).reason
    assert ask_gate(Junk(), q).verdict is Verdict.UNKNOWN  # type: ignore[arg-type]
    assert ask_gate(CostBenefitPolicy(), q).verdict is Verdict.POSITIVE  # positive control


class Counting:
    """Records every question; answers with a fixed verdict."""

    name = "counting"

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.questions: list[GateQuestion] = []

    def judge(self, q: GateQuestion) -> GateDecision:
        self.questions.append(q)
        return GateDecision(verdict=self.verdict, reason=f"counted {len(self.questions)}")


def test_the_gate_is_asked_exactly_once_for_a_1000_wide_fan_out(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    del root
    policy = Counting(Verdict.POSITIVE)
    svc = SpawnService(journal, keystore=keystore, policy=policy)
    result = svc.spawn(svc.durable_caller("root"), intent(1000))
    assert len(result.children) == 1000
    assert len(policy.questions) == 1
    q = policy.questions[0]
    assert q.actor == "agent:root"
    assert q.width == 1000
    assert q.objective == "review every module of the codebase"
    assert q.actor_ceiling == BIG
    assert len(q.affected) == 1000  # the root has no ancestors; then the 1000 children
    assert set(q.affected) == {c.lineage for c in result.children}
    decided = [e.event for e in journal.entries(types=("GateDecided",))]
    assert len(decided) == 1


def test_neutral_allows_and_is_logged(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    del root
    svc = SpawnService(journal, keystore=keystore, policy=Counting(Verdict.NEUTRAL))
    result = svc.spawn(svc.durable_caller("root"), intent(3))
    assert result.gate.verdict is Verdict.NEUTRAL
    assert len(result.children) == 3
    decided = [e.event for e in journal.entries(types=("GateDecided",))]
    assert [d.verdict for d in decided] == [Verdict.NEUTRAL]  # type: ignore[attr-defined]
    assert decided[0].reason == "counted 1"  # type: ignore[attr-defined]


def test_the_default_policy_refuses_a_wasteful_fan_out_through_the_service(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    del root
    svc = SpawnService(journal, keystore=keystore)  # the documented default policy
    svc.spawn(svc.durable_caller("root"), intent(10))  # positive control: 2M tokens / 10
    with pytest.raises(errors.GateRefusedError, match="efficiency"):
        svc.spawn(svc.durable_caller("root"), intent(4000))  # 500 tokens of work each


@pytest.mark.parametrize(
    ("objective", "vague"),
    [
        ("x x x", True),
        ("do stuff", True),
        ("主机", True),
        ("scan hosts", False),
        ("Triage CVE-2024-3094", False),
        ("扫描主机", False),  # "scan hosts"
        ("ホストをスキャンする", False),
        ("فحص المضيفين", False),
        ("review each module for risky calls", False),
    ],
)
def test_vagueness_is_measured_the_same_way_in_every_script(objective: str, vague: bool) -> None:
    q = question(2, CHEAP, objective=objective)
    decision = CostBenefitPolicy().judge(q)
    assert ("too vague" in decision.reason) is vague, decision.reason


def test_an_estimate_without_tokens_cannot_be_weighed() -> None:
    decision = CostBenefitPolicy().judge(
        question(4, "tokens=0,wall=10m,cpu=10m,mem=1GiB,egress=1MB")
    )
    assert decision.verdict is Verdict.UNKNOWN
    assert "no token estimate" in decision.reason
    assert CostBenefitPolicy().judge(question(4, CHEAP)).verdict.allows  # control


class _Conflicting(Journal):
    """The real journal, whose first ``conflicts`` fan-out appends lose a race."""

    conflicts = 0

    def append(self, events: Any, **kwargs: Any) -> Any:
        batch = tuple(events)
        if self.conflicts and any(isinstance(e, GrantMinted) for e in batch):
            self.conflicts -= 1
            raise AppendConflictError("injected: another writer moved the parent's stream")
        return super().append(batch, **kwargs)


@pytest.mark.parametrize("conflicts", [1, 3, 100])
def test_the_gate_is_asked_once_per_fan_out_whatever_the_retries(
    journal: Journal, keystore: KeyStore, root: AgentRecord, conflicts: int
) -> None:
    del root
    racing = _Conflicting.open(journal.location.display)
    racing.conflicts = conflicts
    policy = Counting(Verdict.POSITIVE)
    svc = SpawnService(racing, keystore=keystore, policy=policy)
    caller = svc.durable_caller("root")
    if conflicts < 100:
        result = svc.spawn(caller, intent(2))  # committed on the attempt after the races
        assert len(result.children) == 2
    else:
        with pytest.raises(AppendConflictError):
            svc.spawn(caller, intent(2))  # never commits: the verdict is journaled anyway
    assert len(policy.questions) == 1
    decided = [e.event for e in journal.entries(types=("GateDecided",))]
    assert len(decided) == 1
    assert decided[0].reason == "counted 1"  # type: ignore[attr-defined]


class _Unvalidated:
    """A policy that hands back a decision built without validation."""

    name = "sloppy"

    def judge(self, q: GateQuestion) -> GateDecision:
        del q
        return GateDecision.model_construct(verdict="maybe", reason=7, policy="sloppy")


def test_a_decision_built_without_validation_counts_as_unknown() -> None:
    decision = ask_gate(_Unvalidated(), question(2, CHEAP))
    assert decision.verdict is Verdict.UNKNOWN
    assert "not a valid decision" in decision.reason


def test_an_unvalidated_decision_is_a_journaled_refusal_not_a_crash(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    del root
    svc = SpawnService(journal, keystore=keystore, policy=_Unvalidated())
    with pytest.raises(errors.GateUnknownError):
        svc.spawn(svc.durable_caller("root"), intent(2))
    decided = [e.event for e in journal.entries(types=("GateDecided",))]
    assert [d.verdict for d in decided] == [Verdict.UNKNOWN]  # type: ignore[attr-defined]
