"""``charter demo`` completes in a fresh home, its journal verifies, and its report is
the same scan run without Charter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from charter.app import Charter
from charter.core import KeyStore
from charter.runner import DemoFailedError, scan
from charter.runner.demo import run_demo
from tests.invariants import check_history, check_settled, check_workers, journal_history

WT = Path(__file__).resolve().parents[2]


@pytest.mark.sandbox
def test_the_demo_reports_what_the_plain_scan_finds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in {"CHARTER_HOME", "CHARTER_DB"}}
    env["PYTHONPATH"] = str(WT)
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--json", "demo", "--home", str(home)],
        env=env, capture_output=True, timeout=600, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout)
    assert out["verified"] is True
    paths = scan.files()
    assert len(paths) > 100  # the host has a standard library to scan
    assert out["report"] == scan.report(len(paths), scan.scan(paths))
    statuses = {w["status"] for w in out["workers"]}
    assert statuses == {"exited"}
    depths = {w["lineage"].count("/") for w in out["workers"]}
    assert depths == {1, 2, 3}  # coordinator, reviewers, and a big shard's halves
    verify = subprocess.run(
        [sys.executable, "-m", "charter", "--json", "journal", "verify"],
        env={**env, "CHARTER_HOME": str(home)}, capture_output=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stderr.decode()
    assert json.loads(verify.stdout)["ok"] is True
    with Charter.open(f"sqlite:///{home / 'journal.db'}", keys=KeyStore(home)) as charter:
        history = journal_history(charter.journal)
    assert check_history(history).problems == []
    assert check_workers(history).problems == []
    assert check_settled(history).problems == []
    # The auditor's semantic checks agree: the main job's history breaks no rule.
    audit = subprocess.run(
        [sys.executable, "-m", "charter", "--json", "audit"],
        env={**env, "CHARTER_HOME": str(home)}, capture_output=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout.decode()[-3000:]
    assert json.loads(audit.stdout)["ok"] is True


@pytest.mark.sandbox
def test_a_demo_whose_coordinator_cannot_run_fails_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan, "PY", "/nonexistent/python3")
    with pytest.raises(DemoFailedError, match="gave no report"):
        run_demo(tmp_path / "home", shards=2)
