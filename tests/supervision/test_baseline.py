"""Baselines: learned only from completed workers of their class, integer-exact, and
reproduced to the bit by a replay of the same entries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from charter.core.events import canonical_json
from charter.supervision import (
    SIGMAS,
    Baseline,
    BaselineChanged,
    BaselineClassError,
    Signal,
    Signals,
    WorkerProfiled,
    band_upper,
    learn,
)
from tests.supervision._honest import honest_profiles


def fold(entries: list[WorkerProfiled], task_class: str = "review") -> list[BaselineChanged]:
    baseline, changes = Baseline.empty(task_class), []
    for entry in entries:
        change = learn(baseline, entry)
        if change is not None:
            changes.append(change)
            baseline = Baseline.from_event(change)
    return changes


def test_each_completed_profile_is_a_new_version_with_its_event() -> None:
    entries = [p for _, p in honest_profiles(30)]
    changes = fold(entries)
    assert [c.version for c in changes] == list(range(1, 31))
    assert [c.completed for c in changes] == list(range(1, 31))
    assert [c.lineage for c in changes] == [e.lineage for e in entries]


def test_a_replay_of_the_same_entries_gives_the_same_baselines_to_the_byte() -> None:
    entries = [p for _, p in honest_profiles(50)]
    first = [canonical_json(c.payload()) for c in fold(entries)]
    # The entries as a reader decodes them from the journal (their stored JSON).
    stored = [WorkerProfiled.model_validate_json(canonical_json(e.payload())) for e in entries]
    second = [canonical_json(c.payload()) for c in fold(stored)]
    assert first == second
    # Control: a different order is a different history, with different versions.
    assert [canonical_json(c.payload()) for c in fold(entries[::-1])] != first


def test_only_completed_workers_are_learned() -> None:
    completed = [p for _, p in honest_profiles(5)]
    baseline = Baseline.from_event(fold(completed)[-1])
    for outcome in ("killed", "timed_out", "crashed", "quarantined", "oom_killed"):
        # A huge profile of a worker that did not complete teaches nothing.
        hog = WorkerProfiled(
            lineage="hog", task_class="review", outcome=outcome,
            profile=Signals(cpu_ms=10**9, memory_bytes=10**12),
        )  # fmt: skip
        assert learn(baseline, hog) is None
    # Control: the same profile, completed, moves the band.
    done = WorkerProfiled(
        lineage="hog", task_class="review", outcome="completed",
        profile=Signals(cpu_ms=10**9, memory_bytes=10**12),
    )  # fmt: skip
    change = learn(baseline, done)
    assert change is not None
    assert Baseline.from_event(change).upper(Signal.CPU_MS) >= 10**9


def test_a_profile_of_another_class_is_refused() -> None:
    ((_, entry),) = honest_profiles(1, task_class="scan")
    with pytest.raises(BaselineClassError, match="scan"):
        learn(Baseline.empty("review"), entry)


def test_the_band_is_the_documented_integer_formula() -> None:
    values = [10, 12, 11, 30]
    n, total, sq = len(values), sum(values), sum(v * v for v in values)
    # n*sq - total^2 = 4*1265 - 63^2 = 1091; isqrt = 33; //4 = 8; mean 63//4 = 15
    assert band_upper(n, total, sq, max(values)) == 15 + SIGMAS * 8 == 39
    assert band_upper(1, 7, 49, 7) == 7  # one value: no spread, the band is that value
    assert band_upper(0, 0, 0, 0) == 0


@given(st.lists(st.integers(min_value=0, max_value=10**15), min_size=1, max_size=60))
def test_every_learned_value_is_within_its_band(values: list[int]) -> None:
    entries = [
        WorkerProfiled(
            lineage=f"w{i}", task_class="c", outcome="completed", profile=Signals(cpu_ms=v)
        )
        for i, v in enumerate(values)
    ]
    baseline = Baseline.from_event(fold(entries, "c")[-1])
    assert baseline.upper(Signal.CPU_MS) >= max(values)
    assert baseline.band(Signal.CPU_MS).n == len(values)
