"""``charter init`` killed (SIGKILL, no clean-up) after each of its steps can be run
again to completion; it never deletes what it did not create; racing inits give one
journal, a clear error for the others, no traceback and no stray key."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from charter.app import Charter
from charter.core import KeyStore
from charter.ledger import Journal
from tests.journal.test_cli import ROOT, charter

STEPS = ["key", "schema", "created", "root", "cell"]
INIT = ("init", "--root", "estate", "--cores", "2")


def _killed_after(step: str, url: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``charter --db URL init …`` SIGKILLed right after ``step`` (tests/app/_killed_init)."""
    return subprocess.run(
        [sys.executable, "-m", "tests.app._killed_init", step, "--db", url, *INIT],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )


def _kinds(url: str) -> Counter[str]:
    with Journal.open(url) as journal:
        return Counter(e.type_name for e in journal.entries())


@pytest.mark.parametrize("step", STEPS)
def test_an_init_killed_after_each_step_is_finished_by_running_it_again(
    journal_url: str, tmp_path: Path, step: str
) -> None:
    home = tmp_path / "home"
    killed = _killed_after(step, journal_url, home)
    assert killed.returncode == -9, killed.stderr  # really killed, mid-init
    assert (home / "init-unfinished").exists()
    again = charter("--db", journal_url, *INIT, home=home)
    assert again.returncode == 0, again.stderr
    assert not (home / "init-unfinished").exists()
    # Each step happened exactly once.
    kinds = _kinds(journal_url)
    assert kinds["JournalCreated"] == 1
    assert kinds["AgentRegistered"] == 1
    assert kinds["CellConfigured"] == 1
    verify = charter("--db", journal_url, "journal", "verify", home=home)
    assert verify.returncode == 0, verify.stderr
    # The root's custody key is the one its trust root names, and it can spawn.
    with Charter.open(journal_url, keys=KeyStore(home)) as made:
        made.spawn_service().durable_caller("estate")
    # Done now: a further init is refused (exit 1), as for any initialised journal.
    third = charter("--db", journal_url, *INIT, home=home)
    assert third.returncode == 1
    assert "Traceback" not in third.stderr
    assert _kinds(journal_url) == kinds


def test_an_empty_sqlite_file_is_resumed_only_by_the_init_that_made_it(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    url = f"sqlite:///{path}"
    home = tmp_path / "home"
    # A file this home's init did not make: refused and left as it was.
    path.write_bytes(b"")
    foreign = charter("--db", url, *INIT, home=home)
    assert foreign.returncode == 1
    assert path.exists()
    assert path.read_bytes() == b""
    assert not (home / "keys" / "journal.key").exists()  # no stray key
    path.unlink()
    # Killed after its key step; the empty file written here is the state a kill between
    # creating the file and committing its schema leaves (the schema is one transaction).
    killed = _killed_after("key", url, home)
    assert killed.returncode == -9
    path.write_bytes(b"")
    again = charter("--db", url, *INIT, home=home)
    assert again.returncode == 0, again.stderr
    assert _kinds(url)["JournalCreated"] == 1


def test_a_resumed_init_never_touches_another_journal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    home, other = tmp_path / "home", tmp_path / "other"
    killed = _killed_after("key", url, home)
    assert killed.returncode == -9
    made = charter("--db", url, *INIT, home=other)  # someone else's init takes the path
    assert made.returncode == 0, made.stderr
    before = _kinds(url)
    resumed = charter("--db", url, *INIT, home=home)
    assert resumed.returncode == 1
    assert "another key" in resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert _kinds(url) == before  # nothing written, nothing deleted


def _racing_inits(url: str, homes: list[Path]) -> list[subprocess.CompletedProcess[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "charter", "--db", url, *INIT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        for home in homes
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def test_racing_inits_make_one_journal_and_leave_no_stray_key(
    journal_url: str, tmp_path: Path
) -> None:
    homes = [tmp_path / f"home{i}" for i in range(4)]
    results = _racing_inits(journal_url, homes)
    codes = [r.returncode for r in results]
    assert codes.count(0) == 1, [r.stderr for r in results]
    assert set(codes) == {0, 1}
    for r, home in zip(results, homes, strict=True):
        assert "Traceback" not in r.stderr
        if r.returncode:
            assert not (home / "keys" / "journal.key").exists()  # no stray key
            assert not (home / "init-unfinished").exists()
    kinds = _kinds(journal_url)
    assert kinds["JournalCreated"] == 1
    assert kinds["AgentRegistered"] == 1
