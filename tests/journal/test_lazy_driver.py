"""A command on a SQLite journal never imports the PostgreSQL driver (issue 20 point 6):
psycopg loads only when a PostgreSQL journal is opened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_PROGRAM = """
import sys
from charter.ledger import Journal
from tests.journal._support import Ping

url = sys.argv[1]
Journal.create(url).close()
with Journal.open(url) as journal:
    journal.append([Ping(writer="w", batch=0, n=0)])
    assert [e.position for e in journal.batch_entries(journal.append(
        [Ping(writer="w", batch=1, n=0)], batch="b1")[0].batch)] == [2]
    if len(sys.argv) > 2:  # the positive control: asking for the recorder loads it
        import charter.ledger
        charter.ledger.ChainedPostgresProcessRecorder
print(sorted(m for m in sys.modules if m.split(".")[0] == "psycopg"))
"""


def _loaded(tmp_path: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, f"sqlite:///{tmp_path / 'j.db'}", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_sqlite_journal_appends_without_importing_psycopg(tmp_path: Path) -> None:
    assert _loaded(tmp_path) == "[]"


def test_the_postgres_recorder_is_still_reachable_and_loads_psycopg(tmp_path: Path) -> None:
    # Positive control: the probe does see psycopg when the PostgreSQL side is used.
    assert "'psycopg'" in _loaded(tmp_path, "control")
