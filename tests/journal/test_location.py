"""Journal URLs: what is shown is never parsed back into what is used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from charter.core import BadInputError, UnavailableError
from charter.ledger import Journal, resolve_location
from tests.journal._support import Ping


def test_a_resolved_location_keeps_its_password_and_path() -> None:
    location = resolve_location("postgresql://u:s%40cret@db.example:5433/charter")
    assert location.conninfo is not None
    assert location.conninfo["password"] == "s@cret"
    assert "s@cret" not in location.display
    assert "cret" not in location.display
    # Control: the display string, parsed again, has lost the password.
    reparsed = resolve_location(location.display).conninfo
    assert reparsed is not None
    assert reparsed["password"] == ""
    # Passing the Location on keeps it whole.
    assert resolve_location(location) is location


def test_a_percent_encoded_sqlite_path_is_decoded_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/a%2520b.db"  # the file is literally "a%20b.db"
    location = resolve_location(url)
    assert location.path == tmp_path / "a%20b.db"
    with Journal.create(location) as journal:
        assert journal.location.path == location.path
    assert (tmp_path / "a%20b.db").exists()
    # Control: the display string parsed again names a different file.
    assert resolve_location(location.display).path == tmp_path / "a b.db"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@db.example:99999/charter",  # port out of range
        "postgresql://u@db.example:five/charter",  # port not a number
        "postgresql://u@[::1/charter",  # an unclosed IPv6 host
        "postgresql://u@db.example/charter?sslmod=require",  # a parameter libpq lacks
    ],
)
def test_malformed_postgres_urls_are_bad_input(url: str) -> None:
    with pytest.raises(BadInputError):
        resolve_location(url)


def test_malformed_postgres_url_exits_2_without_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "CHARTER_HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "charter", "--db", "postgresql://u@h:x/db", "journal", "verify"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "malformed" in result.stderr


@pytest.mark.postgres
def test_url_parameters_reach_the_driver(pg_url: str) -> None:
    Journal.create(pg_url).close()
    location = resolve_location(pg_url + "?application_name=charter_probe")
    assert location.conninfo is not None
    assert location.conninfo["application_name"] == "charter_probe"
    with Journal.open(location) as journal:
        journal.append([Ping(writer="w", batch=0, n=0)])  # through the writer pool
        datastore = journal.application.recorder.datastore  # type: ignore[attr-defined]
        with datastore.get_connection() as conn:
            row = conn.execute("SHOW application_name").fetchone()
            assert row["application_name"] == "charter_probe"
        # and through the store's own reads
        assert journal.head() is not None
    # sslmode=require is honoured, not dropped: this server has no TLS, so it refuses
    # (psql would too); the same URL without it connects (the positive control above).
    with pytest.raises(UnavailableError, match="SSL"):
        Journal.open(pg_url + "?sslmode=require")
