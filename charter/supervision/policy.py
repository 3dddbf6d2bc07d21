"""The supervision policy (the operator's one place) and ``decide``: an observation held
against its class's baseline gives a verdict, or none.

A rule names a signal and an action. It triggers when the signal's value is above its
threshold, ``upper * factor_permille // 1000 + slack``, where ``upper`` is the top of
the baseline's band for that signal. ``factor_permille`` is at least 1000 and ``slack``
at least 0, so a threshold is never below the band: **a value within the band never
triggers a rule** (the zero-false-positive property, tested with hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, assert_never

from pydantic import BaseModel, ConfigDict, Field

from charter.supervision.baseline import Baseline
from charter.supervision.errors import BaselineClassError
from charter.supervision.events import (
    Action,
    Evidence,
    KillVerdict,
    PauseVerdict,
    QuarantineVerdict,
    ResumeVerdict,
    ThrottleVerdict,
    Verdict,
)
from charter.supervision.observation import Observation, Signal

__all__ = [
    "DEFAULT_RULES",
    "Rule",
    "Standing",
    "Supervised",
    "SupervisionPolicy",
    "decide",
    "standing_after",
    "supervised_after",
]

_MiB = 1024 * 1024
_SEVERITY: dict[Action, int] = {"throttle": 1, "pause": 2, "kill": 3, "quarantine": 4}


class Standing(StrEnum):
    """Where a live worker stands after its verdicts so far."""

    RUNNING = "running"
    THROTTLED = "throttled"
    PAUSED = "paused"


_LEVEL = {Standing.RUNNING: 0, Standing.THROTTLED: 1, Standing.PAUSED: 2}


class Rule(BaseModel):
    """``action`` when ``signal`` is above ``upper * factor_permille // 1000 + slack``
    and the worker is at least ``after_ms`` old (a rate is noisy in a worker's first
    moments)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    signal: Signal
    action: Action
    factor_permille: int = Field(ge=1000, le=1_000_000)
    slack: int = Field(default=0, ge=0)
    after_ms: int = Field(default=0, ge=0)

    def threshold(self, upper: int) -> int:
        return upper * self.factor_permille // 1000 + self.slack


DEFAULT_RULES: tuple[Rule, ...] = (
    # A CPU hog: first held to a tenth of a core, then killed past three times its class.
    Rule(signal=Signal.CPU_PERMILLE, action="throttle", factor_permille=1500, slack=100,
         after_ms=2000),
    Rule(signal=Signal.CPU_MS, action="kill", factor_permille=3000, slack=2000),
    Rule(signal=Signal.CPU_THROTTLED_MS, action="throttle", factor_permille=3000, slack=2000),
    Rule(signal=Signal.MEMORY_BYTES, action="pause", factor_permille=2000, slack=16 * _MiB),
    Rule(signal=Signal.MEMORY_FAILCNT, action="pause", factor_permille=3000, slack=8),
    # A fork bomb is stopped by pids.max; a worker of a class that never hits it is killed.
    Rule(signal=Signal.PIDS_LIMIT_HITS, action="kill", factor_permille=2000, slack=0),
    Rule(signal=Signal.EGRESS_ATTEMPTS, action="pause", factor_permille=3000, slack=10),
    # Probing for destinations its grant does not hold.
    Rule(signal=Signal.EGRESS_REFUSALS, action="quarantine", factor_permille=3000, slack=3),
    Rule(signal=Signal.SPAWN_CALLS, action="pause", factor_permille=3000, slack=4),
    Rule(signal=Signal.SPAWN_WIDTH, action="pause", factor_permille=2000, slack=2),
    Rule(signal=Signal.SIGN_CALLS, action="pause", factor_permille=3000, slack=4),
    Rule(signal=Signal.RESULT_BYTES, action="pause", factor_permille=3000, slack=4096),
    Rule(signal=Signal.WORKSPACE_BYTES, action="pause", factor_permille=3000, slack=_MiB),
)  # fmt: skip


class SupervisionPolicy(BaseModel):
    """What the operator configures, in one place: a JSON document of this model
    (:meth:`from_json`; see docs/supervision.md). ``version`` is journaled in every
    verdict's evidence; raise it whenever the policy changes.

    ``min_completed``: how many completed workers a class's baseline needs before any
    behaviour verdict is given. Below it ``decide`` gives none (fail-open by design for
    behaviour only: budgets and cgroup caps still bound the worker, and canary touches
    still quarantine). ``throttle_permille``: the CPU quota a throttled worker gets, in
    thousandths of a core."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(default=1, ge=1)
    min_completed: int = Field(default=20, ge=1)
    throttle_permille: int = Field(default=100, ge=1)
    rules: tuple[Rule, ...] = DEFAULT_RULES

    @classmethod
    def from_json(cls, text: str | bytes) -> SupervisionPolicy:
        """The policy a JSON document states (fields left out keep their defaults;
        an unknown field or a bad value is refused, as pydantic's ValidationError)."""
        return cls.model_validate_json(text)


def standing_after(standing: Standing, verdict: Verdict) -> Standing | None:
    """Where a worker stands after ``verdict`` (None: it is being killed)."""
    match verdict:
        case ThrottleVerdict():
            return Standing.PAUSED if standing is Standing.PAUSED else Standing.THROTTLED
        case PauseVerdict():
            return Standing.PAUSED
        case ResumeVerdict():
            return Standing.RUNNING
        case KillVerdict() | QuarantineVerdict():
            return None


def _operators(verdict: Verdict) -> bool:
    return any(e.signal == "operator" for e in verdict.evidence)


@dataclass(frozen=True)
class Supervised:
    """Where a live worker stands after every verdict committed on it, folded in journal
    order whoever appended it (:func:`supervised_after`), and what an operator's resume
    accepted: ``accepted`` maps a signal to the level an operator resumed the worker at
    (``decide`` then holds that signal against ``max(band, level)``); ``held`` is the
    evidence of the throttles and pauses in force since it last stood running."""

    standing: Standing = Standing.RUNNING
    accepted: tuple[tuple[Signal, int], ...] = ()
    held: tuple[Evidence, ...] = ()

    def levels(self) -> dict[Signal, int]:
        return dict(self.accepted)


def supervised_after(state: Supervised, verdict: Verdict) -> Supervised | None:
    """``state`` after ``verdict`` (None: it is being killed).

    A throttle or pause adds its evidence to what holds the worker. A resume sets it
    running again; an **operator's** resume (evidence ``signal="operator"``) also
    accepts, for each signal that held it, the level observed when it was held: the
    same evidence never throttles or pauses it again, and a rule on that signal applies
    again only past its threshold over that level (docs/supervision.md). The
    supervisor's own resume (every signal back within its band) accepts nothing."""
    standing = standing_after(state.standing, verdict)
    if standing is None:
        return None
    if not isinstance(verdict, ResumeVerdict):
        return Supervised(standing, state.accepted, state.held + verdict.evidence)
    levels = state.levels()
    if _operators(verdict):
        for e in state.held:
            if e.signal not in ("canary", "operator"):
                signal = Signal(e.signal)
                levels[signal] = max(levels.get(signal, 0), e.observed)
    return Supervised(Standing.RUNNING, tuple(sorted(levels.items())), ())


def decide(
    observation: Observation,
    baseline: Baseline | None,
    policy: SupervisionPolicy,
    *,
    standing: Standing = Standing.RUNNING,
    accepted: Mapping[Signal, int] | None = None,
) -> Verdict | None:
    """The verdict on ``observation`` (None: nothing to do).

    Without a baseline, or below ``policy.min_completed`` completed workers, none. Of
    the rules that trigger, the most severe action wins, with the evidence of every rule
    that asked for it; an action no stronger than where the worker already stands
    (throttling a throttled or paused worker, pausing a paused one) is none. A throttled
    or paused worker whose every ruled signal is back within its band is resumed.
    ``accepted`` (:attr:`Supervised.accepted`): the levels an operator's resume
    accepted; a signal is held against the higher of its band and that level (the
    evidence's ``upper`` says which was used)."""
    if baseline is None or baseline.completed < policy.min_completed:
        return None
    if observation.task_class != baseline.task_class:
        raise BaselineClassError(
            f"an observation of task class {observation.task_class!r} cannot be decided on "
            f"the baseline of {baseline.task_class!r}"
        )
    signals = observation.signals
    levels = accepted or {}

    def upper(signal: Signal) -> int:
        return max(baseline.upper(signal), levels.get(signal, 0))

    def evidence(signal: Signal, threshold: int) -> Evidence:
        return Evidence(
            signal=signal, observed=signals.value(signal), upper=upper(signal),
            threshold=threshold, baseline_version=baseline.version,
            policy_version=policy.version,
        )  # fmt: skip

    triggered = [
        (rule, evidence(rule.signal, rule.threshold(upper(rule.signal))))
        for rule in policy.rules
        if observation.wall_ms >= rule.after_ms
        and signals.value(rule.signal) > rule.threshold(upper(rule.signal))
    ]
    common: dict[str, Any] = {
        "lineage": observation.lineage,
        "sandbox_id": observation.sandbox_id,
        "task_class": observation.task_class,
        "observation": observation,
    }
    if not triggered:
        return _resumed(observation, upper, policy, standing, evidence, common)
    action = max((rule.action for rule, _ in triggered), key=_SEVERITY.__getitem__)
    if _SEVERITY[action] <= _LEVEL[standing]:
        return None
    why = tuple(ev for rule, ev in triggered if rule.action == action)
    return _verdict(action, why, policy, common)


def _resumed(
    observation: Observation,
    upper: Callable[[Signal], int],
    policy: SupervisionPolicy,
    standing: Standing,
    evidence: Callable[[Signal, int], Evidence],
    common: dict[str, Any],
) -> ResumeVerdict | None:
    """Nothing triggered: a throttled or paused worker whose every ruled signal is back
    within its band is resumed (below a threshold but above the band is not enough)."""
    if standing is Standing.RUNNING:
        return None
    ruled = dict.fromkeys(rule.signal for rule in policy.rules)
    if any(observation.signals.value(s) > upper(s) for s in ruled):
        return None
    return ResumeVerdict(evidence=tuple(evidence(s, upper(s)) for s in ruled), **common)


def _verdict(
    action: Action, why: tuple[Evidence, ...], policy: SupervisionPolicy, common: dict[str, Any]
) -> Verdict:
    match action:
        case "throttle":
            return ThrottleVerdict(evidence=why, quota_permille=policy.throttle_permille, **common)
        case "pause":
            return PauseVerdict(evidence=why, **common)
        case "kill":
            return KillVerdict(evidence=why, **common)
        case "quarantine":
            return QuarantineVerdict(evidence=why, **common)
        case _ as unreachable:
            assert_never(unreachable)
