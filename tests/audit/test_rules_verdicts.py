"""Quarantine verdicts acted on (docs/supervision.md, "Verdicts and what each does";
``charter/runner/_verdicts.py``) as an audit rule (``quarantine``, docs/VERIFYING.md
§9): a workspace digested without a quarantine verdict on that worker and sandbox, from
a sandbox not leased for it, or (a digest made, not an error) after its sandbox ended;
a live, unkilled worker's digest whose ``WorkerKilled`` is not in its append. Each
beside a positive control: the cell's own ways to act on a quarantine are clean.
Entries appended past the control layer, validly chained, as an attacker with write
access would. SQLite and PostgreSQL."""

from __future__ import annotations

import charter.catalogue  # noqa: F401  (registers every event type)
from charter.authority import LineageRevoked
from charter.control.workers import CellStarted, WorkerEnded, WorkerKilled, WorkerStarted
from charter.core import now_ms
from charter.sandbox.events import SandboxDiscarded, SandboxQuarantined, SandboxStarted
from charter.supervision import QuarantineVerdict, WorkspaceDigested
from charter.supervision.events import Evidence
from tests.audit.test_semantic import _append, _audit, _leased, _only, made

__all__ = ["made"]

CANARY = Evidence(signal="canary", observed=1, upper=0, threshold=0, policy_version=1, canary="c-1")


def _verdict(lineage: str, sandbox: str) -> QuarantineVerdict:
    return QuarantineVerdict(
        lineage=lineage, sandbox_id=sandbox, task_class="default", evidence=(CANARY,)
    )


def _digest(lineage: str, sandbox: str, *, made: bool = True) -> WorkspaceDigested:
    if made:
        return WorkspaceDigested(lineage=lineage, sandbox_id=sandbox, digest="a" * 64, files=3)
    return WorkspaceDigested(lineage=lineage, sandbox_id=sandbox, error="no process left")


def _kill(lineage: str) -> WorkerKilled:
    return WorkerKilled(lineage=lineage, reason="quarantine verdict")


def _running(url: str, lineages: list[str]) -> None:
    """Each lineage a live worker in its own started sandbox ``s<n>``."""
    _append(url, *(_leased(f"s{n}", lineage) for n, lineage in enumerate(lineages)))
    _append(
        url,
        *(
            SandboxStarted(sandbox_id=f"s{n}", pid=1, command=("true",))
            for n in range(len(lineages))
        ),
    )
    _append(
        url,
        CellStarted(cell="c", incarnation=1, pid=1, host="h", claim_until_ms=now_ms() + 3_600_000),
    )
    _append(
        url,
        *(
            WorkerStarted(lineage=lineage, cell="c", incarnation=1, sandbox_id=f"s{n}")
            for n, lineage in enumerate(lineages)
        ),
    )


def test_a_quarantine_as_the_cell_acts_on_it_is_clean(made: tuple) -> None:
    url, _, lineages = made
    _running(url, lineages)
    l0, l1, l2 = lineages[:3]
    # Live and unkilled: the digest and the kill in one append, the revocation, the end.
    _append(url, _verdict(l0, "s0"))
    _append(url, _digest(l0, "s0"), _kill(l0))
    _append(url, LineageRevoked(lineage=l0, reason="quarantine verdict"))
    _append(url, SandboxQuarantined(sandbox_id="s0", reason="quarantine verdict"))
    _append(url, WorkerEnded(lineage=l0, outcome="killed", sandbox_id="s0"))
    # Killed already (a kill verdict came first): the digest alone.
    _append(url, _kill(l1), _verdict(l1, "s1"))
    _append(url, _digest(l1, "s1"))
    # Its sandbox gone before the cell could read it: the digest says why not.
    _append(url, _verdict(l2, "s2"), SandboxDiscarded(sandbox_id="s2"))
    _append(url, _digest(l2, "s2", made=False))
    # A verdict the cell never acted on (nothing follows) is no finding either.
    _append(url, _verdict(lineages[3], "s3"))
    report = _audit(url)
    assert report.ok, report.findings


def test_a_digest_without_its_verdict_sandbox_or_kill_is_found(made: tuple) -> None:
    url, _, lineages = made
    _running(url, lineages)
    l0, l1, l2, l3, l4 = lineages
    _append(url, _verdict(l0, "s0"), _verdict(l2, "s2"), _verdict(l3, "s0"))
    _append(url, _verdict(l4, "s4"), SandboxDiscarded(sandbox_id="s2"))
    _append(url, _digest(l0, "s0"), _kill(l0))
    assert _audit(url).ok  # positive control
    (unasked,) = _append(url, _digest(l1, "s1"), _kill(l1))[:1]  # no verdict on l1
    (late,) = _append(url, _digest(l2, "s2"))  # a digest read from a sandbox already gone
    (foreign,) = _append(url, _digest(l3, "s0"))  # s0 is l0's sandbox
    (unkilled,) = _append(url, _digest(l4, "s4"))  # live, unkilled, and no kill with it
    _append(url, _kill(l4))  # its kill, in another append
    report = _audit(url)
    assert _only(report, "quarantine") == [unasked, late, foreign, unkilled]
    assert {f.check for f in report.findings} == {"quarantine"}
    assert any("not committed with" in f.detail for f in report.findings if f.position == unkilled)


def test_a_digest_last_in_the_journal_without_its_kill_is_found(made: tuple) -> None:
    url, _, lineages = made
    _running(url, lineages[:1])
    _append(url, _verdict(lineages[0], "s0"))
    (digest,) = _append(url, _digest(lineages[0], "s0"))
    assert _only(_audit(url), "quarantine") == [digest]
