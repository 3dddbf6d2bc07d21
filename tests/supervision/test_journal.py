"""Supervision's entries in a real journal (SQLite and PostgreSQL): a class's baseline
versions are one pinned sequence (a stale learner loses), and a replay of the journal
reproduces every baseline and every verdict, byte for byte."""

from __future__ import annotations

import pytest

from charter.core.events import canonical_json
from charter.ledger import AppendConflictError, Journal
from charter.supervision import (
    Baseline,
    BaselineChanged,
    SupervisionPolicy,
    WorkerProfiled,
    baseline_stream,
    decide,
    learn,
    observe,
    supervise_stream,
)
from charter.supervision.events import SUPERVISION_EVENTS
from tests.supervision._honest import honest_profiles

POLICY = SupervisionPolicy(min_completed=10)
VERDICTS = ("ThrottleVerdict", "PauseVerdict", "ResumeVerdict", "KillVerdict", "QuarantineVerdict")


def _learn_into(journal: Journal, profiled: WorkerProfiled, baseline: Baseline) -> Baseline:
    """The cell's step at a worker's end: its profile and the baseline it teaches, in one
    append pinned to the class's baseline stream."""
    stream = baseline_stream(profiled.task_class)
    change = learn(baseline, profiled)
    journal.append(
        [profiled, *([change] if change else [])], expect={stream: journal.stream_version(stream)}
    )
    return Baseline.from_event(change) if change else baseline


def test_a_replay_of_the_journal_reproduces_every_baseline_and_verdict(journal_url: str) -> None:
    with Journal.create(journal_url) as journal:
        baseline = Baseline.empty("review")
        entries = list(honest_profiles(25))
        for i, (_, profiled) in enumerate(entries):
            if i % 5 == 4:  # a killed worker of the class: journaled, never learned
                killed = profiled.model_copy(update={"outcome": "killed", "lineage": f"k{i}"})
                baseline = _learn_into(journal, killed, baseline)
            baseline = _learn_into(journal, profiled, baseline)
            # Live workers sampled against the baseline as it stands: some dishonest.
            for n, counters in enumerate(
                ({"cpu_ms": 10**7}, {"egress_refusals": 40}, {"pids_limit_hits": 1}, {})
            ):
                obs = observe(
                    lineage=f"live{i}-{n}", sandbox_id=f"s{i}-{n}", task_class="review",
                    at_ms=i, wall_ms=3000, **counters,
                )  # fmt: skip
                verdict = decide(obs, baseline, POLICY)
                if verdict is not None:
                    stream = supervise_stream(verdict.lineage)
                    journal.append([verdict], expect={stream: journal.stream_version(stream)})
        assert baseline.version == 25  # the five killed profiles taught nothing

        stored = list(journal.entries(types=[c.type_name for c in SUPERVISION_EVENTS]))
        verdicts = [e.event for e in stored if e.type_name in VERDICTS]
        assert len(verdicts) == 3 * (25 - POLICY.min_completed + 1)

        # The replay: fold the journal's profiles afresh; decide each journaled verdict's
        # observation again on the baseline version it names.
        replayed: list[bytes] = []
        versions: dict[int, Baseline] = {}
        fresh = Baseline.empty("review")
        for entry in stored:
            if isinstance(entry.event, WorkerProfiled):
                change = learn(fresh, entry.event)
                if change is not None:
                    replayed.append(canonical_json(change.payload()))
                    fresh = Baseline.from_event(change)
                    versions[fresh.version] = fresh
        journaled = [
            canonical_json(e.event.payload())
            for e in stored
            if isinstance(e.event, BaselineChanged)
        ]
        assert replayed == journaled
        for verdict in verdicts:
            assert verdict.observation is not None
            again = decide(
                verdict.observation, versions[verdict.evidence[0].baseline_version], POLICY
            )
            assert again is not None
            assert canonical_json(again.payload()) == canonical_json(verdict.payload())


def test_a_stale_learner_loses_to_the_one_that_committed(journal_url: str) -> None:
    with Journal.create(journal_url) as journal:
        (_, first), (_, second) = honest_profiles(2)
        stream = baseline_stream("review")
        seen = journal.stream_version(stream)
        empty = Baseline.empty("review")
        change = learn(empty, first)
        assert change is not None
        journal.append([first, change], expect={stream: seen})
        # A second learner decided on the same (now stale) baseline: refused, nothing written.
        stale = learn(empty, second)
        assert stale is not None
        assert stale.version == change.version
        with pytest.raises(AppendConflictError):
            journal.append([second, stale], expect={stream: seen})
        # Control: decided again on what committed, it goes in as the next version.
        ahead = learn(Baseline.from_event(change), second)
        assert ahead is not None
        journal.append([second, ahead], expect={stream: journal.stream_version(stream)})
        versions = [
            e.event.version for e in journal.entries(types=["BaselineChanged"])
            if isinstance(e.event, BaselineChanged)
        ]  # fmt: skip
        assert versions == [1, 2]
