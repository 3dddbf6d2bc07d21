"""The auditor's read-only commands on a SQLite journal load no PostgreSQL driver (and
not the app): `checkpoint key` and `proof verify`, each in a fresh interpreter, with
`-X importtime` listing every module it imported. (`proof inclusion` signs with the
home's key and writes the tree, through charter.app, which still loads it.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.audit._support import make_journal

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "docs" / "vectors"


def _imported(args: list[str], tmp_path: Path, db: str) -> tuple[set[str], str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "charter", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CHARTER_HOME": str(tmp_path / "home"),
             "CHARTER_DB": db},
    )  # fmt: skip
    modules = {
        line.split("|")[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert result.returncode == 0, result.stderr[-2000:]
    return modules, result.stdout


def test_checkpoint_key_and_proof_verify_load_no_postgres_driver(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/j.db"
    journal, _ = make_journal(db)
    journal.close()
    modules, out = _imported(["checkpoint", "key"], tmp_path, db)
    assert "charter.ledger" in modules  # control: the listing is of what it imported
    assert out.startswith("charter.journal/")
    assert not {"psycopg", "charter.app"} & modules
    keys = json.loads((VECTORS / "journal.json").read_text())
    proof = str(VECTORS / "inclusion-3.txt")
    modules, out = _imported(
        ["proof", "verify", proof, "--journal-key", keys["rotated_key"]], tmp_path, db
    )
    assert out.startswith("ok: entry 3")
    assert not {"psycopg", "charter.app"} & modules
