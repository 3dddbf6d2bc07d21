"""Item 8: an auditor with read access only verifies and shows a journal owned by
another user, in a directory it may not write, and leaves nothing beside it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.app import Charter
from charter.core.errors import StateError
from charter.ledger import Journal, JournalCreated
from tests.cli._run import charter

AUDITOR = 65534  # nobody
OWNER = 1  # daemon: someone else

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


@pytest.fixture
def evidence() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is root's only), holding a
    real journal made by ``charter init``, then handed to OWNER."""
    top = Path(tempfile.mkdtemp(prefix="charter-audit-"))
    top.chmod(0o755)
    home = top / "home"
    made = charter("--quiet", "init", home=home)
    assert made.returncode == 0, made.stderr
    folder = top / "evidence"
    folder.mkdir()
    shutil.copy(home / "journal.db", folder / "journal.db")
    try:
        yield folder / "journal.db"
    finally:
        shutil.rmtree(top)


def _hand_over(db: Path, *, file_mode: int, dir_mode: int) -> None:
    os.chown(db, OWNER, OWNER)
    os.chown(db.parent, OWNER, OWNER)
    db.chmod(file_mode)
    db.parent.chmod(dir_mode)


def charter_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by Python as the auditor (the positive controls)."""
    prelude = f"import os; os.setgroups([]); os.setgid({AUDITOR}); os.setuid({AUDITOR}); "
    return subprocess.run(
        [sys.executable, "-c", "import sqlite3; " + prelude + code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _url(db: Path) -> str:
    return f"sqlite:///{db}"


def test_verify_and_show_in_a_read_only_directory(evidence: Path) -> None:
    _hand_over(evidence, file_mode=0o644, dir_mode=0o555)
    # Positive control: a plain read-only SQLite open of this WAL journal, as the
    # auditor, fails here (it needs side files it cannot create).
    control = charter_python(
        f"import sqlite3; c = sqlite3.connect('file:{evidence}?mode=ro', uri=True); "
        "c.execute('SELECT count(*) FROM charter_meta').fetchall()"
    )
    assert control.returncode != 0
    assert "sqlite3.OperationalError" in control.stderr

    verified = charter("--db", _url(evidence), "journal", "verify", uid=AUDITOR)
    assert verified.returncode == 0, verified.stderr
    assert "hash chain of 5 entries verifies" in verified.stdout
    shown = charter("--db", _url(evidence), "--json", "journal", "show", uid=AUDITOR)
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout.splitlines()) == 5
    assert sorted(p.name for p in evidence.parent.iterdir()) == ["journal.db"]


def test_nothing_left_beside_evidence_in_a_writable_directory(evidence: Path) -> None:
    _hand_over(evidence, file_mode=0o644, dir_mode=0o777)
    # Positive control: the plain read-only open leaves -wal/-shm owned by the auditor.
    probe = evidence.parent / "probe.db"
    shutil.copy(evidence, probe)
    os.chown(probe, OWNER, OWNER)
    control = charter_python(
        f"import sqlite3; c = sqlite3.connect('file:{probe}?mode=ro', uri=True); "
        "c.execute('SELECT count(*) FROM charter_meta').fetchall(); c.close()"
    )
    assert control.returncode == 0, control.stderr
    assert {p.name for p in evidence.parent.iterdir()} >= {"probe.db-wal", "probe.db-shm"}
    for leftover in evidence.parent.glob("probe.db*"):
        leftover.unlink()

    for args in (("journal", "verify"), ("journal", "show")):
        done = charter("--db", _url(evidence), *args, uid=AUDITOR)
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in evidence.parent.iterdir()) == ["journal.db"]


def test_an_unreadable_journal_is_not_called_not_a_journal(evidence: Path) -> None:
    _hand_over(evidence, file_mode=0o600, dir_mode=0o755)
    done = charter("--db", _url(evidence), "journal", "verify", uid=AUDITOR)
    assert done.returncode == 1
    assert "permission denied" in done.stderr
    assert "not a Charter journal" not in done.stderr
    assert "Traceback" not in done.stderr


def test_a_read_only_journal_refuses_to_append(evidence: Path) -> None:
    with Journal.open(_url(evidence), read_only=True) as journal:
        head = journal.head()
        with pytest.raises(StateError, match="read-only"):
            journal.append([JournalCreated(created_at="x", journal_key="")])
        assert journal.head() == head
    with Journal.open(_url(evidence)) as journal:  # control: the same append, writable
        journal.append([JournalCreated(created_at="x", journal_key="")])
        assert journal.head() != head


def test_projections_for_an_auditor_match_the_owners(evidence: Path) -> None:
    owner = {c: charter("--json", "--db", _url(evidence), c) for c in ("tree", "budgets")}
    _hand_over(evidence, file_mode=0o644, dir_mode=0o555)
    for command, mine in owner.items():
        theirs = charter("--json", "--db", _url(evidence), command, uid=AUDITOR)
        assert theirs.returncode == 0, theirs.stderr
        expected, got = json.loads(mine.stdout), json.loads(theirs.stdout)
        expected.pop("at_ms", None)
        got.pop("at_ms", None)
        assert got == expected
    slots = charter("--json", "--db", _url(evidence), "slots", uid=AUDITOR)
    assert slots.returncode == 0, slots.stderr
    assert sorted(p.name for p in evidence.parent.iterdir()) == ["journal.db"]


def test_a_read_only_projection_folds_into_a_scratch_file_removed_on_close(
    evidence: Path,
) -> None:
    with Charter.open(_url(evidence), read_only=True) as app, app.projector() as projector:
        scratch = Path(projector.store.path)  # type: ignore[attr-defined]
        assert scratch != evidence
        assert scratch.exists()
        projector.catch_up()
        assert projector.tree().nodes
    assert not scratch.exists()
    assert sorted(p.name for p in evidence.parent.iterdir()) == ["journal.db"]
