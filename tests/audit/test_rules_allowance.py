"""The per-worker journal allowance (decision 0012, docs/door.md) as an audit rule
(``journal-allowance``, docs/VERIFYING.md §9): a worker whose results, waits and
children's schedules make the journal hold more than its floor plus the egress charged
to it, or whose allowance is refused twice, is a finding at that entry; the same
history an honest runner writes (up to the very byte of the bound) is clean. Entries
are appended past the control layer, validly chained, as an attacker with write access
would. SQLite and PostgreSQL."""

from __future__ import annotations

import charter.catalogue  # noqa: F401  (registers every event type)
from charter.audit.semantic import JOURNAL_ENTRY_OVERHEAD, JOURNAL_FLOOR, JOURNAL_WAIT_ENTRIES
from charter.budgets import BudgetRefused
from charter.control import WorkerScheduled
from charter.core import Budget
from charter.core.events import canonical_json
from charter.runner import WorkerResult, WorkerWaiting
from charter.runner._journal_allowance import (
    ENTRY_OVERHEAD,
    FLOOR,
    WAIT_ENTRIES,
    result_bytes,
    wait_bytes,
)
from charter.runner.errors import JournalAllowanceError
from tests.audit.test_semantic import _append, _audit, _only, _usage, made

__all__ = ["made"]

DIGEST = "0" * 64


def _scheduled(lineage: str, argv: str = "true") -> WorkerScheduled:
    return WorkerScheduled(
        fanout="f-x",
        lineage=lineage,
        cell="local",
        argv=(argv,),
        inputs_digest=DIGEST,
        grant_digest=DIGEST,
    )


def _schedule_bytes(event: WorkerScheduled) -> int:
    """What a child's schedule charges its parent (as the runner's ``spawn_bytes``
    counts it per child, less the two entries' overhead the audit does not count)."""
    return len(canonical_json([list(event.argv), list(event.inputs)]))


def _result(lineage: str, text: str) -> WorkerResult:
    return WorkerResult(lineage=lineage, digest=DIGEST, size=len(text), text=text)


def _refused(lineage: str, operation: str = "journal") -> BudgetRefused:
    return BudgetRefused(
        lineage=lineage,
        operation=operation,
        reason=JournalAllowanceError.reason,
        message="refused",
    )


def test_the_audit_restates_the_runners_allowance() -> None:
    """The audit imports no runner: its constants are the runner's, restated."""
    assert (JOURNAL_FLOOR, JOURNAL_ENTRY_OVERHEAD, JOURNAL_WAIT_ENTRIES) == (
        FLOOR,
        ENTRY_OVERHEAD,
        WAIT_ENTRIES,
    )


def _egress(nbytes: int) -> Budget:
    return Budget(tokens=0, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=nbytes)


def test_a_worker_past_its_floor_and_egress_is_found(made: tuple) -> None:
    url, _, lineages = made
    worker = lineages[2]
    result = _result(worker, "a" * 60_000)
    wait = WorkerWaiting(lineage=worker, children=(f"{worker}/c1",), timeout_ms=1000)
    child = _scheduled(f"{worker}/c1", "b" * 60_000)
    _append(url, _scheduled(worker), result, wait, child)
    caused = result_bytes(result) + wait_bytes(wait) + _schedule_bytes(child)
    assert caused < JOURNAL_FLOOR
    assert _audit(url).ok  # positive control: within the floor
    _append(url, _usage(worker, _egress(20_000)))
    bound = JOURNAL_FLOOR + 20_000
    # A child whose schedule brings the worker to its bound exactly: still within it.
    exact = _scheduled(f"{worker}/c2", "c" * (bound - caused - len('[[""],[]]')))
    assert caused + _schedule_bytes(exact) == bound
    _append(url, exact)
    assert _audit(url).ok  # positive control: the egress charged raised the bound
    (over,) = _append(url, _scheduled(f"{worker}/c3"))  # one schedule more
    (again,) = _append(url, _result(worker, "d"))
    report = _audit(url)
    assert _only(report, "journal-allowance") == [over, again]
    assert {f.check for f in report.findings} == {"journal-allowance"}
    assert all(f.lineage == worker for f in report.findings)


def test_only_a_workers_allowance_is_bounded(made: tuple) -> None:
    """The root agent is no worker (it is not scheduled): its children's schedules are
    not charged against a floor (its spawns are paid from its own budget)."""
    url, _, _ = made
    _append(url, *(_scheduled(f"agent:estate/big-{n}", "e" * 60_000) for n in range(3)))
    assert _audit(url).ok


def test_a_second_journal_refusal_is_found(made: tuple) -> None:
    url, _, lineages = made
    _append(url, _refused(lineages[0]), _refused(lineages[1]))
    _append(url, _refused(lineages[0], operation="spawn"))  # another operation's
    assert _audit(url).ok  # positive control: one journal refusal per worker
    (second,) = _append(url, _refused(lineages[1]))
    report = _audit(url)
    assert _only(report, "journal-allowance") == [second]
    assert {f.position for f in report.findings} == {second}
