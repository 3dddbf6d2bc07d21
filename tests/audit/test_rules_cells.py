"""Fenced cell incarnations (docs/cell.md, ``WorkerLifecycle``) as an audit rule
(``cell-claim``, docs/VERIFYING.md §9): a worker started, or a claim renewed, by an
incarnation that a newer one fenced, or after its claim lapsed, or that never started;
incarnations out of order; and a worker ended twice (``worker-lifecycle``). Each beside
a positive control: the same moves made as the control plane makes them are clean.
Entries appended past the control layer, validly chained, as an attacker with write
access would. SQLite and PostgreSQL."""

from __future__ import annotations

import time

import charter.catalogue  # noqa: F401  (registers every event type)
from charter.control.workers import (
    CellClaimRenewed,
    CellStarted,
    WorkerEnded,
    WorkerScheduled,
    WorkerStarted,
)
from charter.core import now_ms
from tests.audit.test_semantic import _append, _audit, _leased, _only, made

__all__ = ["made"]

HOUR = 3_600_000


def _started(cell: str, incarnation: int, until: int | None) -> CellStarted:
    return CellStarted(cell=cell, incarnation=incarnation, pid=1, host="h", claim_until_ms=until)


def _worker(lineage: str, cell: str, incarnation: int, sandbox: str) -> WorkerStarted:
    return WorkerStarted(lineage=lineage, cell=cell, incarnation=incarnation, sandbox_id=sandbox)


def _past(ms: int) -> None:
    """Wait until the wall clock (which commit times follow) is past ``ms``."""
    deadline = time.monotonic() + 10
    while now_ms() <= ms:
        assert time.monotonic() < deadline, "the clock did not pass the claim's lapse"
        time.sleep(0.01)


def _sandboxes(url: str, lineages: list[str]) -> None:
    _append(url, *(_leased(f"s{n}", lineage) for n, lineage in enumerate(lineages)))


def test_a_fenced_incarnation_starts_and_renews_nothing(made: tuple) -> None:
    url, _, lineages = made
    _sandboxes(url, lineages)
    _append(url, _started("c", 1, now_ms() + HOUR))
    _append(url, _worker(lineages[0], "c", 1, "s0"))
    _append(url, CellClaimRenewed(cell="c", incarnation=1, until_ms=now_ms() + 2 * HOUR))
    _append(url, _started("c", 2, now_ms() + HOUR))  # a take-over: it fences incarnation 1
    _append(url, _worker(lineages[1], "c", 2, "s1"))
    assert _audit(url).ok  # positive control: each start by the newest incarnation
    (start,) = _append(url, _worker(lineages[2], "c", 1, "s2"))
    (renew,) = _append(url, CellClaimRenewed(cell="c", incarnation=1, until_ms=now_ms() + HOUR))
    (unborn,) = _append(url, _worker(lineages[3], "c", 3, "s3"))  # never started
    (nowhere,) = _append(url, _worker(lineages[4], "gone", 1, "s4"))  # a cell never started
    report = _audit(url)
    assert _only(report, "cell-claim") == [start, renew, unborn, nowhere]
    assert {f.check for f in report.findings} == {"cell-claim"}
    fenced = next(f for f in report.findings if f.position == start)
    assert "incarnation 2 fenced it" in fenced.detail


def test_incarnations_start_in_order(made: tuple) -> None:
    url, _, _ = made
    _append(url, _started("c", 1, None), _started("c", 2, now_ms() + HOUR))
    _append(url, _started("d", 1, now_ms() + HOUR))  # each cell counts its own
    assert _audit(url).ok  # positive control
    (skipped,) = _append(url, _started("c", 4, now_ms() + HOUR))
    (back,) = _append(url, _started("d", 1, now_ms() + HOUR))
    assert _only(_audit(url), "cell-claim") == [skipped, back]


def test_a_lapsed_claim_starts_and_renews_nothing(made: tuple) -> None:
    url, _, lineages = made
    _sandboxes(url, lineages)
    short = now_ms() + 300
    _append(url, _started("kept", 1, short))
    _append(url, CellClaimRenewed(cell="kept", incarnation=1, until_ms=now_ms() + HOUR))
    _append(url, _started("lapsed", 1, short))
    _past(short)
    _append(url, _worker(lineages[0], "kept", 1, "s0"))
    _append(url, _started("old", 1, None))  # a start of before claims: no lapse
    _append(url, _worker(lineages[1], "old", 1, "s1"))
    assert _audit(url).ok  # positive control: renewed in time, or never bounded
    (start,) = _append(url, _worker(lineages[2], "lapsed", 1, "s2"))
    (renew,) = _append(url, CellClaimRenewed(cell="lapsed", incarnation=1, until_ms=short + HOUR))
    (still,) = _append(url, _worker(lineages[3], "lapsed", 1, "s3"))  # the renewal did not count
    report = _audit(url)
    assert _only(report, "cell-claim") == [start, renew, still]
    assert {f.check for f in report.findings} == {"cell-claim"}
    assert all("after its claim lapsed" in f.detail for f in report.findings)


def test_a_worker_ends_at_most_once(made: tuple) -> None:
    url, _, lineages = made
    _sandboxes(url, lineages)
    _append(url, _started("c", 1, now_ms() + HOUR), _worker(lineages[0], "c", 1, "s0"))
    end = WorkerEnded(lineage=lineages[0], outcome="exited", exit_code=0, sandbox_id="s0")
    _append(url, end)
    _append(url, WorkerEnded(lineage=lineages[1], outcome="failed", reason="its cell is gone"))
    assert _audit(url).ok  # positive control: one end each (one never started)
    (again,) = _append(url, end.model_copy(update={"outcome": "failed", "exit_code": None}))
    report = _audit(url)
    assert _only(report, "worker-lifecycle") == [again]
    assert {f.position for f in report.findings} == {again}


def _scheduled(lineage: str, cell: str, cell_class: str | None) -> WorkerScheduled:
    return WorkerScheduled(
        fanout="f",
        lineage=lineage,
        cell=cell,
        argv=("/bin/true",),
        inputs_digest="0" * 64,
        grant_digest="0" * 64,
        cell_class=cell_class,
    )


def test_a_worker_asking_a_class_is_placed_on_a_cell_started_with_it(made: tuple) -> None:
    url, _, lineages = made
    until = now_ms() + HOUR
    gpu = CellStarted(cell="g", incarnation=1, pid=1, host="h", claim_until_ms=until,
                      classes=("cpu", "gpu"))  # fmt: skip
    _append(url, gpu, _started("b", 1, until))
    _append(url, _scheduled(lineages[0], "g", "gpu"), _scheduled(lineages[1], "b", None))
    _append(url, _scheduled(lineages[2], "g", None))  # an unclassed worker goes anywhere
    assert _audit(url).ok  # positive control: each class worker on a cell of its class
    (elsewhere,) = _append(url, _scheduled(lineages[3], "b", "gpu"))
    (unborn,) = _append(url, _scheduled(lineages[4], "never", "gpu"))
    # the cell restarted without the class: its newest incarnation is what counts
    _append(url, gpu.model_copy(update={"incarnation": 2, "classes": ("cpu",)}))
    (dropped,) = _append(url, _scheduled(lineages[0], "g", "gpu"))  # scheduled again
    report = _audit(url)
    assert _only(report, "cell-claim") == [elsewhere, unborn, dropped]
    assert {f.check for f in report.findings} == {"cell-claim"}
    found = {f.position: f for f in report.findings}
    assert found[elsewhere].lineage == lineages[3]
    assert "has classes: none" in found[elsewhere].detail
    assert "never started" in found[unborn].detail
    assert "incarnation 2 has classes: cpu" in found[dropped].detail
