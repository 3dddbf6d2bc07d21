"""Queued workers wait visibly: ``charter cell status`` shows the queue in order and
each worker's status; the independent fold flags what it must (its positive control)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from charter.control import WorkerSpec
from tests.invariants import check_settled, check_workers
from tests.runner._support import fan_out
from tests.runner.conftest import initialise

WT = Path(__file__).resolve().parents[2]


def test_cell_status_shows_the_queue_in_order(journal_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=1) as charter:
        result = fan_out(charter, 3, WorkerSpec(argv=("/bin/true",)))
    lineages = [str(c.lineage) for c in result.children]
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--db", journal_url, "--json", "cell", "status"],
        env={**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": str(WT)},
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert out["queued"] == lineages[1:]
    assert out["holders"] == {"processing": lineages[:1]}
    assert out["caps"]["processing"] == 1
    statuses = {w["lineage"]: w["status"] for w in out["workers"]}
    assert statuses == {lineages[0]: "admitted", lineages[1]: "queued", lineages[2]: "queued"}


_AT = datetime(2026, 1, 1, tzinfo=UTC)


def _h(
    *entries: tuple[str, dict[str, object]],
) -> list[tuple[int, str, dict[str, object], datetime]]:
    return [(i + 1, kind, p, _AT) for i, (kind, p) in enumerate(entries)]


CONFIGURED = ("CellConfigured", {"cell": "c", "caps": {"processing": 1}})
SCHEDULED = ("WorkerScheduled", {"lineage": "agent:r/sa-1"})
LEASED = ("SandboxLeased", {"sandbox_id": "s1", "lineage": "agent:r/sa-1"})
STARTED = ("WorkerStarted", {"lineage": "agent:r/sa-1", "sandbox_id": "s1"})
EXEC = ("SandboxStarted", {"sandbox_id": "s1"})


def _admitted(lineage: str, cap: int = 1) -> tuple[str, dict[str, object]]:
    return ("SlotAdmitted", {"cell": "c", "lineage": lineage, "resource": "processing", "cap": cap})


def test_the_fold_passes_a_clean_history_and_flags_each_breach() -> None:
    clean = _h(CONFIGURED, SCHEDULED, _admitted("agent:r/sa-1"), LEASED, STARTED, EXEC)
    assert check_workers(clean).problems == []
    assert check_workers(_h(CONFIGURED, SCHEDULED, STARTED, EXEC)).problems == [
        "4: sandbox s1 started before its lease"
    ]
    assert (
        check_workers(_h(CONFIGURED, LEASED, STARTED, EXEC))
        .problems[0]
        .endswith("started unscheduled")
    )
    twice = _h(CONFIGURED, SCHEDULED, LEASED, STARTED, EXEC, STARTED, EXEC)
    assert len(check_workers(twice).problems) == 2
    over = _h(CONFIGURED, _admitted("agent:r/sa-1"), _admitted("agent:r/sa-2"))
    assert "over its cap" in check_workers(over).problems[0]
    killed = ("WorkerEnded", {"lineage": "agent:r/sa-1", "outcome": "killed"})
    assert "no kill event" in check_workers(_h(SCHEDULED, killed)).problems[0]
    unsettled = check_settled(_h(SCHEDULED, _admitted("agent:r/sa-1"), LEASED, STARTED, EXEC))
    assert unsettled.problems == [
        "agent:r/sa-1 was scheduled and never ended",
        "sandbox s1 started and was never discarded",
    ]
