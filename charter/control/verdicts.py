"""An operator's verdict on a live worker: ``throttle``, ``pause``, ``resume``, ``kill``
or ``quarantine``, appended to ``supervise:<lineage>`` like any verdict the supervision
loop decides, with the operator and their reason as its evidence. The cell that runs
the worker carries out the committed entry (:mod:`charter.runner._verdicts`), whoever
appended it."""

from __future__ import annotations

from typing import Literal

from charter.control.workers import WorkerStarted
from charter.core import BadInputError, Lineage
from charter.ledger import AppendConflictError, Committed, Journal
from charter.supervision import (
    Evidence,
    KillVerdict,
    PauseVerdict,
    QuarantineVerdict,
    ResumeVerdict,
    SupervisionPolicy,
    ThrottleVerdict,
    Verdict,
    supervise_stream,
)

__all__ = ["OPERATOR_TASK_CLASS", "VerdictAction", "operator_verdict"]

VerdictAction = Literal["throttle", "pause", "resume", "kill", "quarantine"]
OPERATOR_TASK_CLASS = "unclassified"
"""The task class an operator's verdict names while nothing schedules workers by class."""
_TRIES = 5  # a verdict racing another on the worker's stream is decided again
_DEFAULTS = SupervisionPolicy()


def operator_verdict(
    journal: Journal,
    lineage: Lineage,
    action: VerdictAction,
    *,
    operator: str,
    reason: str,
    quota_permille: int | None = None,
) -> Committed:
    """Append ``action`` on ``lineage``'s sandbox (refused when it never started: there
    is no sandbox to name), pinned to its verdict stream as it was read."""
    sandbox_id = _sandbox_of(journal, str(lineage))
    evidence = Evidence(
        signal="operator",
        observed=0,
        upper=0,
        threshold=0,
        policy_version=_DEFAULTS.version,
        operator=operator,
        reason=reason or None,
    )
    common = {
        "lineage": str(lineage),
        "sandbox_id": sandbox_id,
        "task_class": OPERATOR_TASK_CLASS,
        "evidence": (evidence,),
    }
    verdict: Verdict
    match action:
        case "throttle":
            quota = _DEFAULTS.throttle_permille if quota_permille is None else quota_permille
            if quota < 1:
                raise BadInputError(f"--quota must be at least 1 permille, not {quota}")
            verdict = ThrottleVerdict(**common, quota_permille=quota)
        case "pause":
            verdict = PauseVerdict(**common)
        case "resume":
            verdict = ResumeVerdict(**common)
        case "kill":
            verdict = KillVerdict(**common)
        case "quarantine":
            verdict = QuarantineVerdict(**common)
    stream = supervise_stream(str(lineage))
    for attempt in range(_TRIES):
        try:
            return journal.append([verdict], expect={stream: journal.stream_version(stream)})[0]
        except AppendConflictError:
            if attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _sandbox_of(journal: Journal, lineage: str) -> str:
    """The sandbox ``lineage``'s worker was started in (its newest start)."""
    found = None
    for entry in journal.entries(types=("WorkerStarted",)):
        event = entry.event
        if isinstance(event, WorkerStarted) and event.lineage == lineage:
            found = event.sandbox_id
    if found is None:
        raise BadInputError(
            f"{lineage} has no started worker: a verdict names a live sandbox "
            "(`charter cell status` lists the running workers)"
        )
    return found
