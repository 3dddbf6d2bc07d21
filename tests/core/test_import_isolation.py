"""What each entry point drags in, checked in fresh interpreters.

The offline verifiers (the journal chain walk in charter.audit, the grant-chain check in
charter.authority) must load no journal library and no database driver, so an auditor
can run them anywhere; ``charter --help`` must answer without loading pydantic. Each
check has a positive control showing that the same probe does see the module when it
is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DRIVERS = ("eventsourcing", "psycopg")

# Runs ``charter`` as ``python -m charter`` does, and dumps sys.modules at exit (after
# the CLI's sys.exit), so whatever any code path imported is seen.
_CLI_PROBE = """
import atexit, json, runpy, sys
out = sys.argv[1]
def dump():
    with open(out, "w") as f:
        json.dump(sorted(sys.modules), f)
atexit.register(dump)
sys.argv = ["charter", *sys.argv[2:]]
runpy.run_module("charter", run_name="__main__", alter_sys=True)
"""


def _env(tmp: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "CHARTER_DB"}
    return {**base, "CHARTER_HOME": str(tmp / "home"), "PYTHONPATH": str(ROOT)}


def _modules_after(code: str, tmp: Path) -> set[str]:
    """The top-level package names in sys.modules after running ``code`` afresh."""
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=_env(tmp),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return {name.split(".")[0] for name in json.loads(result.stdout.strip().splitlines()[-1])}


def _cli_modules(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    out = tmp / "modules.json"
    result = subprocess.run(
        [sys.executable, "-c", _CLI_PROBE, str(out), *args],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=_env(tmp),
        timeout=120,
        check=False,
    )
    return result, set(json.loads(out.read_text()))


def test_offline_verifiers_load_no_journal_and_no_driver(tmp_path: Path) -> None:
    loaded = _modules_after(
        "import charter.audit, charter.authority\n"
        "from charter.audit import audit_chain, verify_chain\n"
        "from charter.authority import verify_grant_chain\n"
        "assert callable(audit_chain) and callable(verify_chain)\n"
        "assert callable(verify_grant_chain)\n",
        tmp_path,
    )
    assert "charter" in loaded  # the probe did import Charter
    for driver in DRIVERS:
        assert driver not in loaded, driver
    assert "sqlite3" not in loaded


def test_the_raw_reader_and_the_pure_core_load_no_eventsourcing_and_no_pydantic(
    tmp_path: Path,
) -> None:
    """Issue 24: what the auditor's light commands import (the ledger's raw reader, the
    proof texts, the key history, charter.core's package) loads neither eventsourcing
    nor pydantic; a model asked for by name is still there (loaded then)."""
    loaded = _modules_after(
        "from charter.ledger import open_reader, resolve_location\n"
        "from charter.audit.tree import MerkleLog\n"
        "from charter.audit.proofs import InclusionText\n"
        "from charter.audit.keys import KeyHistory\n"
        "import charter.core, charter.audit\n",
        tmp_path,
    )
    assert "sqlite3" in loaded  # the probe did import the reader (its driver)
    for heavy in ("eventsourcing", "pydantic", "pydantic_core", *DRIVERS):
        assert heavy not in loaded, heavy
    lazily = _modules_after("from charter.core import Budget\n", tmp_path)
    assert "pydantic" in lazily  # control: asked for, a model loads pydantic


def test_the_probe_sees_the_journal_library_when_it_is_loaded(tmp_path: Path) -> None:
    """Positive control: importing the journal does load eventsourcing (and the same
    probe reports it)."""
    loaded = _modules_after("from charter.ledger import Journal\n", tmp_path)
    assert "eventsourcing" in loaded


def test_charter_help_loads_no_pydantic(tmp_path: Path) -> None:
    result, modules = _cli_modules(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    assert "spawn-schema" in result.stdout  # it did print the command listing
    assert "charter.cli" in modules
    assert not {m for m in modules if m.split(".")[0] in ("pydantic", "pydantic_core")}
    for driver in DRIVERS:
        assert driver not in modules


def test_spawn_schema_does_load_pydantic(tmp_path: Path) -> None:
    """Positive control: a command that needs the models loads pydantic, and the probe
    sees it."""
    result, modules = _cli_modules(tmp_path, "spawn-schema")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)  # the schema was printed
    assert "pydantic" in modules
