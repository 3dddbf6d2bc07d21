"""The CLI surface of the journal: init, verify, show, and bad input."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from charter.ledger import Journal

from ._support import Ping

ROOT = Path(__file__).resolve().parents[2]


def charter(
    *args: str, home: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "CHARTER_DB"}
    return subprocess.run(
        [sys.executable, "-m", "charter", *args],
        capture_output=True,
        text=True,
        cwd=cwd or home.parent,
        env={**base, "CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=120,
        check=False,
    )


def _snapshot(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("charter: error: ")
    return lines[0]


def test_init_makes_home_journal_and_key_then_walkthrough(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = charter("--json", "init", home=home)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["journal"].endswith("home/journal.db")
    key = home / "keys" / "journal.key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert (home / "keys").stat().st_mode & 0o777 == 0o700
    assert key.read_text().strip() not in result.stdout + result.stderr  # never printed

    with Journal.open(f"sqlite:///{home / 'journal.db'}") as j:
        assert j.meta.journal_key == doc["journal_key"]
        j.append([Ping(writer="cli", batch=0, n=i) for i in range(3)])

    shown = charter(
        "--json",
        "journal",
        "show",
        "--type",
        "TestPing",
        home=home,
        env={"PYTHONPATH": f"{ROOT}{os.pathsep}{Path(__file__).parent}"},
    )
    # TestPing is a test-only type: the CLI process does not know it and says so.
    assert shown.returncode == 1
    assert "does not know" in _one_line_error(shown)


def test_show_prints_json_lines_with_the_contract_keys(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert charter("init", home=home).returncode == 0
    # Append through a child process that knows the test event type.
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]];"
        "from tests.journal._support import Ping;"
        "from charter.ledger.journal import Journal;"
        "from charter.cli import main;"
        "j = Journal.open();"
        "first = j.append([Ping(writer='x', batch=0, n=i) for i in range(3)])[0].position;"
        "j.close();"
        "sys.argv = ['charter', '--json', 'journal', 'show', '--from', str(first + 1)]; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), str(ROOT)],
        capture_output=True,
        text=True,
        env={**os.environ, "CHARTER_HOME": str(home)},
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 2  # the last two of the three pings, from --from on
    assert lines[1]["position"] == lines[0]["position"] + 1
    assert set(lines[0]) == {
        "position",
        "type",
        "hash",
        "prev_hash",
        "recorded_at",
        "batch",
        "payload",
    }
    assert lines[1]["prev_hash"] == lines[0]["hash"]
    assert lines[0]["payload"] == {"writer": "x", "batch": 0, "n": 1, "pad": ""}


def test_second_init_refuses_and_writes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert charter("init", home=home).returncode == 0
    before = _snapshot(home)
    again = charter("init", home=home)
    assert again.returncode == 1
    assert "already holds a Charter journal" in _one_line_error(again)
    assert _snapshot(home) == before


def test_init_that_cannot_create_the_file_leaves_no_key_behind(tmp_path: Path) -> None:
    home = tmp_path / "home"
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    failed = charter("--db", f"sqlite:///{blocker}/journal.db", "init", home=home)
    assert failed.returncode == 1
    assert "cannot create SQLite journal" in _one_line_error(failed)
    assert not (home / "keys" / "journal.key").exists()
    # Nothing half-made blocks the next try (the control: the same home then works).
    ok = charter("--db", f"sqlite:///{tmp_path}/journal.db", "init", home=home)
    assert ok.returncode == 0, ok.stderr


def test_unknown_scheme_is_a_one_line_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = charter("--db", "mysql://root@localhost/x", "init", home=home)
    assert result.returncode == 2  # bad input
    assert "sqlite:///PATH or postgresql://" in _one_line_error(result)
    assert not home.exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns


@pytest.mark.parametrize("command", [("init",), ("journal", "verify"), ("journal", "show")])
def test_unreachable_postgres_is_a_one_line_error(tmp_path: Path, command: tuple[str, ...]) -> None:
    home = tmp_path / "home"
    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/test"
    result = charter("--db", url, *command, home=home)
    assert result.returncode == 1
    assert "cannot reach PostgreSQL" in _one_line_error(result)
    assert not home.exists()


def test_a_file_that_is_not_a_journal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    other = tmp_path / "notes.db"
    other.write_bytes(b"my notes, not a database\n" * 10)
    before = _snapshot(tmp_path)
    for command in (("journal", "verify"), ("journal", "show"), ("init",)):
        result = charter("--db", f"sqlite:///{other}", *command, home=home)
        assert result.returncode == 1
        assert (
            "not a journal" in _one_line_error(result) or "not a Charter journal" in result.stderr
        )
    assert _snapshot(tmp_path) == before  # no -wal/-shm files, no home, bytes unchanged


def test_a_sqlite_database_that_is_not_a_journal(tmp_path: Path) -> None:
    import sqlite3

    other = tmp_path / "app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = other.read_bytes()
    result = charter("--db", f"sqlite:///{other}", "journal", "verify", home=tmp_path / "h")
    assert result.returncode == 1
    assert "not a Charter journal" in _one_line_error(result)
    assert other.read_bytes() == before


def test_missing_journal_says_to_run_init(tmp_path: Path) -> None:
    result = charter("journal", "verify", home=tmp_path / "home")
    assert result.returncode == 1
    assert "charter init" in _one_line_error(result)
    assert not (tmp_path / "home").exists()


@pytest.mark.postgres
def test_init_and_verify_on_postgres(tmp_path: Path, pg_url: str) -> None:
    home = tmp_path / "home"
    assert charter("--db", pg_url, "init", home=home).returncode == 0
    again = charter("--db", pg_url, "init", home=tmp_path / "other-home")
    assert again.returncode == 1
    assert "already holds a Charter journal" in _one_line_error(again)
    ok = charter("--db", pg_url, "--json", "journal", "verify", home=home)
    assert ok.returncode == 0
    assert json.loads(ok.stdout)["ok"] is True
