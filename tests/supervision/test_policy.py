"""decide: zero false positives on honest workers, the documented rules on dishonest
ones, and every verdict reproduced from what it journals."""

from __future__ import annotations

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from charter.core.events import canonical_json
from charter.supervision import (
    Baseline,
    BaselineClassError,
    Evidence,
    KillVerdict,
    PauseVerdict,
    QuarantineVerdict,
    ResumeVerdict,
    Rule,
    Signal,
    Signals,
    Standing,
    Supervised,
    SupervisionPolicy,
    ThrottleVerdict,
    decide,
    learn,
    observe,
    standing_after,
    supervised_after,
)
from tests.supervision._honest import honest_profiles

POLICY = SupervisionPolicy()


def trained(count: int = 40, seed: int = 7) -> Baseline:
    baseline = Baseline.empty("review")
    for _, profiled in honest_profiles(count, seed=seed):
        change = learn(baseline, profiled)
        assert change is not None
        baseline = Baseline.from_event(change)
    return baseline


BASELINE = trained()


def sample(wall_ms: int = 4000, **counters: int) -> object:
    return observe(
        lineage="w-x", sandbox_id="sbx-x", task_class="review", at_ms=5000, wall_ms=wall_ms,
        **counters,
    )  # fmt: skip


def test_100_honest_workers_of_one_class_get_no_verdict() -> None:
    """Workers the baseline never saw (another seed), every sample of every life."""
    seen = 0
    for life, _ in honest_profiles(100, seed=1234):
        for observation in life:
            seen += 1
            assert decide(observation, BASELINE, POLICY) is None, observation
    assert seen > 100 * 7  # at least 8 samples a life
    # Control: the same decide flags a hog of that class at once.
    hog = sample(cpu_ms=4000 * 2, wall_ms=4000)  # two cores' worth
    assert isinstance(decide(hog, BASELINE, POLICY), ThrottleVerdict)


_within = st.fixed_dictionaries(
    {s.value: st.integers(min_value=0, max_value=BASELINE.upper(s)) for s in Signal}
)


@settings(max_examples=300)
@given(values=_within, wall=st.integers(min_value=0, max_value=10**7))
def test_an_observation_within_every_band_never_gets_a_verdict(
    values: dict[str, int], wall: int
) -> None:
    observation = sample(wall_ms=wall).model_copy(update={"signals": Signals(**values)})
    assert decide(observation, BASELINE, POLICY) is None


@settings(max_examples=200)
@given(
    values=_within,
    rules=st.lists(
        st.builds(
            Rule,
            signal=st.sampled_from(list(Signal)),
            action=st.sampled_from(["throttle", "pause", "kill", "quarantine"]),
            factor_permille=st.integers(min_value=1000, max_value=10_000),
            slack=st.integers(min_value=0, max_value=10**6),
            after_ms=st.integers(min_value=0, max_value=10**4),
        ),
        max_size=20,
    ),
)
def test_no_policy_the_model_admits_flags_an_observation_within_its_bands(
    values: dict[str, int], rules: list[Rule]
) -> None:
    policy = SupervisionPolicy(rules=tuple(rules), min_completed=1)
    observation = sample().model_copy(update={"signals": Signals(**values)})
    assert decide(observation, BASELINE, policy) is None


@pytest.mark.parametrize("field", ["factor_permille", "slack"])
def test_a_rule_that_would_reach_inside_the_band_is_refused(field: str) -> None:
    bad = {"factor_permille": 999} if field == "factor_permille" else {"slack": -1}
    with pytest.raises(pydantic.ValidationError):
        Rule(signal=Signal.CPU_MS, action="kill", **{"factor_permille": 1000, **bad})


def test_the_policy_is_closed_and_frozen() -> None:
    with pytest.raises(pydantic.ValidationError):
        SupervisionPolicy.from_json('{"version": 2, "rulez": []}')
    with pytest.raises(pydantic.ValidationError):
        POLICY.version = 3  # type: ignore[misc]
    assert SupervisionPolicy.from_json('{"version": 2}').rules == POLICY.rules


def test_without_enough_completed_workers_there_is_no_verdict() -> None:
    hog = sample(cpu_ms=10**7)
    young = trained(count=POLICY.min_completed - 1)
    assert decide(hog, young, POLICY) is None
    assert decide(hog, None, POLICY) is None
    assert isinstance(decide(hog, trained(POLICY.min_completed), POLICY), KillVerdict)


def test_the_most_severe_action_wins_with_its_evidence() -> None:
    hog = sample(cpu_ms=10**7, egress_refusals=100, wall_ms=4000)
    verdict = decide(hog, BASELINE, POLICY)
    assert isinstance(verdict, QuarantineVerdict)
    (evidence,) = verdict.evidence
    assert evidence.signal is Signal.EGRESS_REFUSALS
    assert evidence.observed == 100
    assert evidence.upper == BASELINE.upper(Signal.EGRESS_REFUSALS)
    assert evidence.threshold == evidence.upper * 3 + 3
    assert (evidence.baseline_version, evidence.policy_version) == (40, 1)


def test_a_fork_bomb_is_killed_and_a_big_result_paused() -> None:
    assert isinstance(decide(sample(pids_limit_hits=1), BASELINE, POLICY), KillVerdict)
    big = sample(result_bytes=BASELINE.upper(Signal.RESULT_BYTES) * 3 + 4097)
    assert isinstance(decide(big, BASELINE, POLICY), PauseVerdict)
    # Control: one byte less is at the threshold, which does not trigger.
    edge = sample(result_bytes=BASELINE.upper(Signal.RESULT_BYTES) * 3 + 4096)
    assert decide(edge, BASELINE, POLICY) is None


def test_throttle_then_resume_once_back_within_the_band() -> None:
    upper = BASELINE.upper(Signal.CPU_PERMILLE)
    hot = sample(cpu_ms=4000 * (upper * 3 // 2 + 101) // 1000 + 10, wall_ms=4000)
    verdict = decide(hot, BASELINE, POLICY)
    assert isinstance(verdict, ThrottleVerdict)
    assert verdict.quota_permille == POLICY.throttle_permille
    standing = standing_after(Standing.RUNNING, verdict)
    assert standing is Standing.THROTTLED
    assert decide(hot, BASELINE, POLICY, standing=standing) is None  # not twice
    # Below the threshold but above the band: still throttled (hysteresis).
    warm = sample(cpu_ms=4000 * (upper + 50) // 1000, wall_ms=4000)
    assert decide(warm, BASELINE, POLICY, standing=standing) is None
    cool = sample(cpu_ms=4000 * upper // 1000, wall_ms=4000)
    resumed = decide(cool, BASELINE, POLICY, standing=standing)
    assert isinstance(resumed, ResumeVerdict)
    assert all(e.observed <= e.upper for e in resumed.evidence)
    assert standing_after(standing, resumed) is Standing.RUNNING
    assert decide(cool, BASELINE, POLICY) is None  # a running worker is not resumed


def test_a_paused_worker_is_not_throttled_but_is_killed() -> None:
    upper = BASELINE.upper(Signal.CPU_PERMILLE)
    hot = sample(cpu_ms=3000 * (upper * 2) // 1000, wall_ms=3000)
    assert isinstance(decide(hot, BASELINE, POLICY), ThrottleVerdict)  # control
    assert decide(hot, BASELINE, POLICY, standing=Standing.PAUSED) is None
    bomb = sample(pids_limit_hits=5)
    assert isinstance(decide(bomb, BASELINE, POLICY, standing=Standing.PAUSED), KillVerdict)


def test_an_observation_of_another_class_is_refused() -> None:
    other = sample().model_copy(update={"task_class": "scan"})
    with pytest.raises(BaselineClassError):
        decide(other, BASELINE, POLICY)


def test_every_verdict_is_reproduced_from_what_it_journals() -> None:
    """A replay: the stored verdict's observation, decided again on the baseline of the
    version it names and the policy, gives the same verdict, byte for byte."""
    versions = {BASELINE.version: BASELINE}
    cases = [
        sample(cpu_ms=10**7),
        sample(egress_refusals=50),
        sample(pids_limit_hits=2),
        sample(result_bytes=10**6),
        sample(cpu_ms=9_000, wall_ms=4000),
    ]
    for observation in cases:
        verdict = decide(observation, BASELINE, POLICY)
        assert verdict is not None
        stored = canonical_json(verdict.payload())
        decoded = type(verdict).model_validate_json(stored)
        assert decoded.observation is not None
        again = decide(
            decoded.observation, versions[decoded.evidence[0].baseline_version or 0], POLICY
        )
        assert again is not None
        assert canonical_json(again.payload()) == stored


def _resume(*, operator: bool) -> ResumeVerdict:
    evidence = (
        Evidence(signal="operator", observed=0, upper=0, threshold=0, policy_version=1,
                 operator="ops", reason="it is fine")
        if operator
        else Evidence(signal=Signal.WORKSPACE_BYTES, observed=0, upper=1, threshold=1,
                      baseline_version=1, policy_version=1)
    )  # fmt: skip
    return ResumeVerdict(lineage="w-x", sandbox_id="sbx-x", task_class="review",
                         evidence=(evidence,))  # fmt: skip


def test_an_operators_resume_accepts_the_level_that_paused_it() -> None:
    """Paused for its workspace, resumed by an operator: the same evidence never pauses
    it again (its band for that signal is now the level the operator accepted), more
    of it past the rule's threshold over that level does. The supervisor's own resume
    accepts nothing (control), and a running worker with nothing accepted is paused by
    the same evidence (control)."""
    upper = BASELINE.upper(Signal.WORKSPACE_BYTES)
    big = upper * 3 + (1 << 20) + 1  # just past the default rule's threshold
    full = sample(workspace_bytes=big)
    pause = decide(full, BASELINE, POLICY)
    assert isinstance(pause, PauseVerdict)
    paused = supervised_after(Supervised(), pause)
    assert paused is not None
    assert paused.standing is Standing.PAUSED
    resumed = supervised_after(paused, _resume(operator=True))
    assert resumed is not None
    assert resumed.standing is Standing.RUNNING
    assert resumed.levels() == {Signal.WORKSPACE_BYTES: big}
    again = decide(full, BASELINE, POLICY, standing=resumed.standing, accepted=resumed.levels())
    assert again is None  # the same evidence: not paused again
    assert isinstance(decide(full, BASELINE, POLICY), PauseVerdict)  # control: it would be
    # Growth up to the threshold over the accepted level: nothing; one byte past: paused.
    edge = sample(workspace_bytes=big * 3 + (1 << 20))
    past = sample(workspace_bytes=big * 3 + (1 << 20) + 1)
    levels = resumed.levels()
    assert decide(edge, BASELINE, POLICY, accepted=levels) is None
    second = decide(past, BASELINE, POLICY, accepted=levels)
    assert isinstance(second, PauseVerdict)
    assert [e.upper for e in second.evidence if e.signal == Signal.WORKSPACE_BYTES] == [big]
    # The supervisor's own resume accepts nothing: the same evidence pauses it again.
    own = supervised_after(paused, _resume(operator=False))
    assert own is not None
    assert own.levels() == {}
    assert isinstance(decide(full, BASELINE, POLICY, accepted=own.levels()), PauseVerdict)
    # A kill or quarantine ends it: nothing more is folded.
    assert supervised_after(resumed, KillVerdict(**_common(), evidence=pause.evidence)) is None


def _common() -> dict[str, str]:
    return {"lineage": "w-x", "sandbox_id": "sbx-x", "task_class": "review"}
