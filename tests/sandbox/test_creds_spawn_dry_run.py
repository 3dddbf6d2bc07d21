"""A test run of a spawn (``charter spawn --dry-run``, ``Charter.spawn`` with a worker
marked ``dry_run``): its workers start with every held credential withheld, journaled
(``WorkerScheduled.dry_run``, then a ``CredentialWithheld`` per dial), never an empty
value; the children a dry-run worker spawns through its door are test runs too. The
control: the same spawn without it gets its credential injected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from charter.app import Charter
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import WorkerScheduled, WorkerSpec
from charter.core import Budget, KeyStore
from charter.runner.events import WorkerResult
from charter.sandbox import CredentialInjected, CredentialWithheld
from tests.runner._support import make_cell, running, until_idle

from ._creds_support import FETCH, Server, token_estate

pytestmark = pytest.mark.sandbox

ROOT_DIR = Path(__file__).resolve().parents[2]
ROOT = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=4GiB,egress=1GB")
SLOT = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=256MiB,egress=10MB")
COST = Budget.parse("tokens=20k,wall=60s,cpu=60s,mem=512MiB,egress=2MB")
TOKEN = "dry-run-token-0123456789abcdef"

# Fetches argv[1] itself, then spawns one child that fetches it too (its door spawn).
PARENT = """
import subprocess, sys, json
sys.path.insert(0, '/workspace')
import charter_door
url, fetch = sys.argv[1], sys.argv[2]
door = charter_door.Door()
mine = subprocess.run(['/usr/bin/python3', '-I', '-c', fetch, url], capture_output=True,
                      text=True).stdout
cost = {"tokens": 8000, "wall_ms": 30000, "cpu_ms": 30000, "mem_bytes": 1 << 28,
        "egress_bytes": 1 << 20}
(kid,) = door.spawn({"width": 1, "objective": "fetch the page with the held token",
                     "estimated_cost": cost},
                    [{"argv": ['/usr/bin/python3', '-I', '-c', fetch, url]}])["children"]
theirs = door.wait([kid], 60)["children"][kid]["result"]
door.result(json.dumps({"mine": mine, "theirs": theirs}))
"""


def _setup(tmp_path: Path) -> tuple[Charter, Server, str]:
    charter, server, where = token_estate(tmp_path, TOKEN, ROOT)
    return charter, server, f"http://{where[0]}/"


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "control"])
def test_a_dry_run_spawn_withholds_every_credential_down_its_tree(
    tmp_path: Path, state_dir: Path, dry_run: bool
) -> None:
    charter, server, url = _setup(tmp_path)
    with charter:
        intent = SpawnIntent.model_validate({
            "width": 1, "objective": "fetch the page, and have a child fetch it too",
            "estimated_cost": COST, "grant": {"fanout": 2},
        })  # fmt: skip
        worker = WorkerSpec(
            argv=("/usr/bin/python3", "-I", "-c", PARENT, url, FETCH), dry_run=dry_run
        )
        charter.spawn(
            "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=(worker,)
        )
        with running(make_cell(charter, None, state_dir, door=True, budget=SLOT)) as cell:
            until_idle(cell)
        entries = list(charter.journal.entries())
    server.close()
    scheduled = [e.event for e in entries if isinstance(e.event, WorkerScheduled)]
    assert [s.dry_run for s in scheduled] == [dry_run, dry_run]  # the child inherits it
    results = [e.event for e in entries if isinstance(e.event, WorkerResult)]
    out = json.loads(next(r.text for r in results if r.text.startswith("{")))
    withheld = [e.event for e in entries if isinstance(e.event, CredentialWithheld)]
    injected = [e.event for e in entries if isinstance(e.event, CredentialInjected)]
    if dry_run:
        assert out["mine"].split()[:1] == ["403"]
        assert out["theirs"].split()[:1] == ["403"]
        assert len(withheld) == 2
        assert injected == []
        assert server.seen == []  # the destination was never reached
    else:  # the control: both fetches carried the held token
        assert out["mine"].split()[:2] == ["200", "ok"]
        assert out["theirs"].split()[:2] == ["200", "ok"]
        assert withheld == []
        assert len(injected) == 2
        assert [s.headers["authorization"] for s in server.seen] == [f"Bearer {TOKEN}"] * 2


def test_the_cli_spawn_dry_run_says_so_and_journals_it(tmp_path: Path) -> None:
    charter, server, _ = _setup(tmp_path)
    charter.close()
    server.close()
    env = os.environ | {
        "CHARTER_HOME": str(tmp_path / "home"),
        "CHARTER_DB": f"sqlite:///{tmp_path}/journal.db",
        "PYTHONPATH": str(ROOT_DIR),
    }
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--json", "spawn", "--dry-run", "--parent",
         "agent:estate", "--width", "1", "--objective", "fetch the page with the token",
         "--est-cost", "tokens=20k,wall=60s,cpu=60s,mem=512MiB,egress=2MB", "--",
         "/bin/true"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "test run" in done.stderr
    assert json.loads(done.stdout)["dry_run"] is True
    with Charter.open(f"sqlite:///{tmp_path}/journal.db", keys=KeyStore(tmp_path / "home")) as c:
        (scheduled,) = [e.event for e in c.journal.entries(types=("WorkerScheduled",))]
    assert isinstance(scheduled, WorkerScheduled)
    assert scheduled.dry_run is True
