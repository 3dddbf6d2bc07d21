"""Journal URLs: what is shown is never parsed back into what is used."""

from __future__ import annotations

from pathlib import Path

from charter.ledger import Journal, resolve_location


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
