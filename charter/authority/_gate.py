"""The net-potential-gain gate: asked once per fan-out decision, never per worker.

A policy answers a :class:`GateQuestion` with a :class:`GateDecision`. Positive and
neutral let the fan-out go (neutral is journaled as such); negative and unknown refuse.
A policy that raises, or returns anything but a decision, counts as unknown: the gate
fails closed.

The default policy, :class:`CostBenefitPolicy`, judges from the inputs alone:

1. No estimate (zero on every axis), or no tokens in it → unknown: gain cannot be
   weighed against nothing, and per-worker efficiency (rule 4) is measured in tokens.
2. An objective with too little in it → unknown: too vague to judge. "Too little" is
   measured the same way in every script: the distinct letters and digits it uses,
   where a letter of a caseless script (CJK ideographs, kana, Arabic, …) counts twice,
   since one such letter carries about what two Latin letters do. Fewer than
   ``min_objective_signs`` (7) is too vague: "x x x" (1) and "do stuff" (6) are;
   "scan hosts" (7), "扫描主机" (8) and "Triage CVE-2024-3094" are not.
3. The estimate, plus a fixed coordination overhead per worker, exceeds the actor's
   budget ceiling on any axis → negative: the fan-out cannot pay for itself.
4. Overhead share: per-worker work is ``tokens / width``; efficiency is
   ``work / (work + overhead_tokens)``. Below ``min_efficiency`` → negative (more is
   spent starting workers than working); below ``good_efficiency`` → neutral.
5. The estimate uses more than ``big_bet_share`` of the actor's ceiling on any axis →
   neutral: a large bet, allowed but logged.
6. Otherwise positive. The most severe verdict of all checks wins, with every reason.
"""

from __future__ import annotations

import unicodedata
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from charter.core.budget import Budget
from charter.core.errors import describe_invalid
from charter.core.lineage import Lineage
from charter.core.text import shown

__all__ = [
    "Verdict",
    "GateQuestion",
    "GateDecision",
    "GatePolicy",
    "CostBenefitPolicy",
    "FixedPolicy",
    "ask_gate",
    "objective_signs",
]


class Verdict(StrEnum):
    POSITIVE = "positive"
    NEUTRAL = "neutral"
    NEGATIVE = "negative"
    UNKNOWN = "unknown"

    @property
    def allows(self) -> bool:
        return self in {Verdict.POSITIVE, Verdict.NEUTRAL}


# Most severe first: a negative finding outweighs an unknown, which outweighs neutral.
_SEVERITY = {Verdict.NEGATIVE: 3, Verdict.UNKNOWN: 2, Verdict.NEUTRAL: 1, Verdict.POSITIVE: 0}


class GateQuestion(BaseModel):
    """Everything the gate is told about one fan-out."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    actor: Lineage
    affected: tuple[Lineage, ...] = Field(
        description="Those the fan-out touches: the actor's ancestors (whose budgets and "
        "fan-out it draws on) and the prospective children."
    )
    width: int = Field(ge=1)
    objective: str
    estimated_cost: Budget
    actor_ceiling: Budget


class GateDecision(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: Verdict
    reason: str
    policy: str = ""


class GatePolicy(Protocol):
    """A pluggable judgement; ``name`` is journaled with each decision."""

    name: str

    def judge(self, question: GateQuestion) -> GateDecision: ...


class CostBenefitPolicy:
    """The documented default: weighs estimated cost and per-worker overhead against the
    actor's ceiling (see the module docstring for the rules)."""

    name = "cost-benefit/v1"

    def __init__(
        self,
        *,
        overhead_tokens: int = 2_000,
        min_efficiency: float = 0.5,
        good_efficiency: float = 0.8,
        big_bet_share: float = 0.5,
        min_objective_signs: int = 7,
    ) -> None:
        self.overhead_tokens = overhead_tokens
        self.min_efficiency = min_efficiency
        self.good_efficiency = good_efficiency
        self.big_bet_share = big_bet_share
        self.min_objective_signs = min_objective_signs

    def judge(self, question: GateQuestion) -> GateDecision:
        findings: list[tuple[Verdict, str]] = []
        cost, ceiling, width = question.estimated_cost, question.actor_ceiling, question.width
        if cost == Budget.zero():
            findings.append((Verdict.UNKNOWN, "no cost estimate: gain cannot be weighed"))
        elif cost.tokens == 0:
            findings.append(
                (Verdict.UNKNOWN, "no token estimate: per-worker efficiency cannot be weighed")
            )
        if objective_signs(question.objective) < self.min_objective_signs:
            findings.append(
                (Verdict.UNKNOWN, f"objective '{shown(question.objective)}' is too vague to judge")
            )
        # On plain integers, not Budget arithmetic: an estimate of 2^63 − 1 plus the
        # overhead is more than a Budget may hold, and must read as "over the ceiling",
        # not fail the policy (Python's integers do not overflow).
        overhead = dict.fromkeys(Budget.AXES, 0) | {"tokens": self.overhead_tokens * width}
        over = [a for a in Budget.AXES if getattr(cost, a) + overhead[a] > getattr(ceiling, a)]
        if over:
            findings.append(
                (
                    Verdict.NEGATIVE,
                    f"estimated cost plus overhead exceeds the actor's ceiling on "
                    f"{', '.join(over)}",
                )
            )
        if cost.tokens > 0:
            work = cost.tokens / width
            efficiency = work / (work + self.overhead_tokens)
            if efficiency < self.min_efficiency:
                findings.append(
                    (
                        Verdict.NEGATIVE,
                        f"{work:.0f} tokens of work per worker against {self.overhead_tokens} "
                        f"of overhead: efficiency {efficiency:.2f} is below "
                        f"{self.min_efficiency}",
                    )
                )
            elif efficiency < self.good_efficiency:
                findings.append(
                    (Verdict.NEUTRAL, f"overhead is a large share (efficiency {efficiency:.2f})")
                )
        big = [
            a
            for a in Budget.AXES
            if getattr(ceiling, a) > 0
            and getattr(cost, a) > self.big_bet_share * getattr(ceiling, a)
        ]
        if big:
            findings.append(
                (Verdict.NEUTRAL, f"a large bet: over half the actor's ceiling on {', '.join(big)}")
            )
        if not findings:
            return GateDecision(
                verdict=Verdict.POSITIVE,
                reason=f"{width} worker(s) within the ceiling at good efficiency",
                policy=self.name,
            )
        worst = max(findings, key=lambda f: _SEVERITY[f[0]])[0]
        return GateDecision(
            verdict=worst, reason="; ".join(r for _, r in findings), policy=self.name
        )


def objective_signs(text: str) -> int:
    """How much an objective says, the same way in every script: its distinct letters
    and digits, a letter of a caseless script (category Lo: ideographs, kana, Arabic …)
    counting twice."""
    signs = {c.casefold() for c in text if unicodedata.category(c)[0] in "LN"}
    return sum(2 if unicodedata.category(c) == "Lo" else 1 for c in signs)


class FixedPolicy:
    """Always the same verdict (for operators who gate elsewhere, and for tests)."""

    def __init__(self, verdict: Verdict, reason: str = "fixed policy") -> None:
        self.verdict, self.reason = verdict, reason
        self.name = f"fixed/{verdict.value}"

    def judge(self, question: GateQuestion) -> GateDecision:
        del question
        return GateDecision(verdict=self.verdict, reason=self.reason, policy=self.name)


def ask_gate(policy: GatePolicy, question: GateQuestion) -> GateDecision:
    """Ask ``policy`` once. A policy that raises or answers with anything but a
    :class:`GateDecision` yields ``unknown`` (fail closed), with the failure as reason."""
    name = shown(getattr(policy, "name", type(policy).__name__), limit=100)
    try:
        decision = policy.judge(question)
    except Exception as e:  # noqa: BLE001 - any policy failure means "unknown", fail closed
        # A model's refusal in people's words (no pydantic codes or links); a policy's
        # own text escaped, so it cannot forge lines in the journal's readers.
        said = describe_invalid(e) if isinstance(e, ValidationError) else str(e)
        return GateDecision(
            verdict=Verdict.UNKNOWN,
            reason=shown(f"policy {name} failed: {type(e).__name__}: {said}", limit=500),
            policy=name,
        )
    try:
        # Re-validated, not trusted: a policy may hand back an object built without
        # validation (model_construct) whose verdict is not a verdict at all.
        checked = _revalidated(decision)
    except (TypeError, ValidationError):
        return GateDecision(
            verdict=Verdict.UNKNOWN,
            reason=f"policy {name} answered {type(decision).__name__}, not a valid decision",
            policy=name,
        )
    return checked if checked.policy else checked.model_copy(update={"policy": name})


def _revalidated(decision: object) -> GateDecision:
    if not isinstance(decision, GateDecision):
        raise TypeError(f"{type(decision).__name__} is not a GateDecision")
    return GateDecision.model_validate(decision.model_dump(warnings=False))
