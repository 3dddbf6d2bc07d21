"""An entry of a projected type at a version this Charter does not know is a clear
error (never a crash on its payload); a row planted at a position <= 0 is seen by
verify (exit 3) and by show, not skipped."""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent

from charter.app import CellSetup, Charter, Settings
from charter.control import Ceiling
from charter.core import Budget, KeyStore, UnknownEventTypeError, canonical_json
from tests.journal.test_cli import charter

BUDGET = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB")


def _init(url: str, home: Path) -> None:
    made, _ = Charter.initialise(
        url,
        root="estate",
        ceiling=Ceiling(budget=BUDGET),
        cell=CellSetup(cores=2),
        keys=KeyStore(home),
        settings=Settings(),
    )
    made.close()


def test_a_projected_type_at_an_unknown_version_is_a_clear_error(
    journal_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    _init(journal_url, home)
    budgets = charter("--db", journal_url, "budgets", home=home)
    assert budgets.returncode == 0, budgets.stderr  # positive control
    with Charter.open(journal_url, keys=KeyStore(home)) as made:
        at = datetime.now(UTC).isoformat(timespec="microseconds")
        state = canonical_json({"at": at, "payload": {"grant": "a future shape"}})
        made.journal.application.recorder.insert_events(  # chained like any entry
            [StoredEvent(uuid.uuid4(), 1, "GrantMinted/v9", state)]
        )
        with (
            pytest.raises(UnknownEventTypeError, match="GrantMinted/v9"),
            made.projector() as projector,
        ):
            projector.catch_up()
    for command in ("budgets", "tree"):
        result = charter("--db", journal_url, command, home=home)
        assert result.returncode == 1, (command, result.stderr)
        assert "GrantMinted/v9" in result.stderr
        assert "Traceback" not in result.stderr


def _plant_at_minus_one(url: str) -> None:
    """A row written behind Charter's back at position -1 (the triggers refuse only
    changes to existing rows and REPLACE; an INSERT at an unused key is possible)."""
    prev, chain = os.urandom(32), os.urandom(32)
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(
                "INSERT INTO stored_events (rowid, originator_id, originator_version, topic, "
                "state, prev_hash, chain_hash) VALUES (-1, ?, 1, 'TestPing/v1', ?, ?, ?)",
                (uuid.uuid4().hex, b'{"at":"x","payload":{}}', prev, chain),
            )
    else:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO charter_events (notification_id, originator_id, "
                "originator_version, topic, state, prev_hash, chain_hash) "
                "VALUES (-1, %s, 1, 'TestPing/v1', %s, %s, %s)",
                (uuid.uuid4(), b'{"at":"x","payload":{}}', prev, chain),
            )


def test_a_row_at_a_negative_position_is_caught_by_verify(journal_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    _init(journal_url, home)
    ok = charter("--db", journal_url, "journal", "verify", home=home)
    assert ok.returncode == 0, ok.stderr  # positive control
    _plant_at_minus_one(journal_url)
    bad = charter("--db", journal_url, "--json", "journal", "verify", home=home)
    assert bad.returncode == 3, bad.stdout + bad.stderr
    report = json.loads(bad.stdout)
    assert report["ok"] is False
    assert report["first_bad_position"] == -1
    shown = charter("--db", journal_url, "--json", "journal", "show", "--to", "1", home=home)
    assert "Traceback" not in shown.stderr


def test_the_projections_read_the_versions_the_event_classes_write() -> None:
    import charter.catalogue  # noqa: F401 - every event type registered
    from charter.core.events import event_types
    from charter.projections._fold import _HANDLED_VERSION, _HANDLERS

    types = event_types()
    for name in _HANDLERS:
        assert str(types[name].schema_version) == _HANDLED_VERSION, name
