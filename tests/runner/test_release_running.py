"""`charter lease release` of a running worker is refused (exit 4, journaled) with the
way to stop it that charges it (`charter revoke`): a release would leave what it uses
charged nowhere. A lease with nothing running is released (the control). Real sandboxes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import BudgetRefused
from charter.control import WorkerSpec
from charter.core import Budget, now_ms
from charter.runner.events import WorkerStarted
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner.conftest import initialise

ROOT_DIR = Path(__file__).resolve().parents[2]


def _release(url: str, home: Path, lineage: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT_DIR)}
    return subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, "lease", "release", lineage],
        env=env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


@pytest.mark.sandbox
def test_releasing_a_running_workers_lease_is_refused_with_the_way_out(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=2) as charter:
        worker = str(fan_out(charter, 1, WorkerSpec(argv=("/bin/sleep", "30"))).children[0].lineage)
        idle = SpawnIntent(
            width=1,
            objective="a lease with nothing running under it",
            estimated_cost=Budget.parse("tokens=10k,wall=1m,cpu=1m,mem=256MiB,egress=0"),
        )
        plain = str(
            charter.spawn("agent:estate", idle, policy=FixedPolicy(Verdict.POSITIVE))
            .children[0]
            .lineage
        )
        with running(make_cell(charter, None, state_dir)) as cell:
            deadline = time.monotonic() + 60
            while not any(
                isinstance(e.event, WorkerStarted)
                for e in charter.journal.entries(types=("WorkerStarted",))
            ):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            refused = _release(journal_url, home, worker)
            assert refused.returncode == 4, refused.stderr
            assert f"charter revoke {worker}" in refused.stderr
            assert _release(journal_url, home, plain).returncode == 0  # the control
            charter.revoke(worker, "the way out")
            until_idle(cell, 30)
        reasons = [
            e.event.reason
            for e in charter.journal.entries(types=("BudgetRefused",))
            if isinstance(e.event, BudgetRefused) and e.event.lineage == worker
        ]
        assert reasons[:1] == ["worker-running"]
        charter.views.refresh(charter.journal)
        book = charter.views.resources.book
        # Ended (and perhaps left the book since, which only an ended lease does).
        assert book.retired(plain) or not book.get(plain).active(now_ms())
        assert book.retired(worker) or not book.get(worker).active(now_ms())  # returned
