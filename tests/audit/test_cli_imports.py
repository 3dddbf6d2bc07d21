"""The auditor's commands on a SQLite journal load no PostgreSQL driver, no
eventsourcing, no pydantic (not even pydantic_core) and not the app: ``checkpoint key``
(with --current and --history too), ``proof verify``, ``proof inclusion`` and ``proof
consistency``, each in a fresh interpreter, with ``-X importtime`` listing every module
it imported. Those that open the journal read it through the ledger's raw reader
(``charter.ledger``, asserted so); ``proof verify`` (offline) loads no journal at all.
``charter checkpoint`` (it signs through the app) is the positive control: the same
listing shows it loading all of them. Issue 24: their start-up is then ≤ 1.5×
``charter --version`` (bench/audit.py --startup measures it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.audit.test_cli_audit import charter, ok

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "docs" / "vectors"
WATCHED = {
    "psycopg", "eventsourcing", "pydantic", "pydantic_core", "charter.app", "charter.ledger"
}  # fmt: skip


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


@pytest.fixture
def journal_db(tmp_path: Path) -> str:
    """A SQLite journal made by `charter init`, with its home (the journal's key)."""
    db = f"sqlite:///{tmp_path}/j.db"
    ok(charter("init", home=tmp_path / "home", db=db))
    return db


# (arguments, what they print first, which of WATCHED they import: exactly)
_JOURNAL_READERS = {"charter.ledger"}
_EVERYTHING = {
    "eventsourcing",
    "pydantic",
    "pydantic_core",
    "charter.ledger",
    "psycopg",
    "charter.app",
}
CASES = {
    "checkpoint key": (["checkpoint", "key"], "charter.journal/", _JOURNAL_READERS),
    "checkpoint key --current": (
        ["checkpoint", "key", "--current"], "charter.journal/", _JOURNAL_READERS
    ),
    "checkpoint key --history": (
        ["checkpoint", "key", "--history", "{tmp}/history.json"],
        "charter.journal/",
        _JOURNAL_READERS,
    ),
    "proof inclusion": (["proof", "inclusion", "2"], "c2sp.org/tlog-proof@v1", _JOURNAL_READERS),
    "proof consistency": (
        ["proof", "consistency", "1", "2"], "charter/consistency-proof@v1", _JOURNAL_READERS
    ),
    "checkpoint (control)": (["checkpoint"], "charter.journal/", _EVERYTHING),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_on_sqlite_each_command_imports_exactly(name: str, tmp_path: Path, journal_db: str) -> None:
    args, first, expected = CASES[name]
    modules, out = _imported([a.format(tmp=tmp_path) for a in args], tmp_path, journal_db)
    assert "charter.cli" in modules  # the listing is of what it imported
    assert out.startswith(first), out
    assert modules & WATCHED == expected


def test_proof_verify_imports_no_journal(tmp_path: Path, journal_db: str) -> None:
    keys = json.loads((VECTORS / "journal.json").read_text())
    proof = str(VECTORS / "inclusion-3.txt")
    args = ["proof", "verify", proof, "--journal-key", keys["rotated_key"]]
    modules, out = _imported(args, tmp_path, journal_db)
    assert out.startswith("ok: entry 3")
    assert modules & WATCHED == set()
