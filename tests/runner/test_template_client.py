"""A cell's workspace template holds the door's client, and a worker may be importing it
while another cell of the same name (another incarnation, another process on the host's
default state dir) starts: the client is never rewritten in place. Unchanged, it is left
as it is (same inode, same bytes); stale, it is replaced whole by a rename, so a reader
sees the old file or the new one, never an empty or half-written one (the cause of a
worker's ``module 'charter_door' has no attribute 'Door'`` under a loaded host)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from charter.runner.cell import Cell

CLIENT = Path(__file__).resolve().parents[2] / "charter" / "runner" / "client.py"


def _template(state_dir: Path) -> Path:
    owner: Any = SimpleNamespace(state_dir=state_dir, cell="c1")
    return Cell._own_template(owner)


def test_an_unchanged_client_is_not_rewritten(tmp_path: Path) -> None:
    client = _template(tmp_path) / "charter_door.py"
    assert client.read_bytes() == CLIENT.read_bytes()
    before = client.stat()
    reader = client.open("rb")  # a worker's import, under way
    try:
        assert (_template(tmp_path) / "charter_door.py").stat().st_ino == before.st_ino
        assert client.stat().st_mtime_ns == before.st_mtime_ns
        assert reader.read() == CLIENT.read_bytes()  # nothing truncated under it
    finally:
        reader.close()


def test_a_stale_client_is_replaced_whole_and_an_open_reader_keeps_the_old(
    tmp_path: Path,
) -> None:
    client = _template(tmp_path) / "charter_door.py"
    client.write_bytes(b"# an older client\n")
    stale = client.stat().st_ino
    reader = client.open("rb")
    try:
        _template(tmp_path)
        assert client.read_bytes() == CLIENT.read_bytes()
        assert client.stat().st_ino != stale  # a rename, not a rewrite
        assert reader.read() == b"# an older client\n"
    finally:
        reader.close()
    assert [p.name for p in client.parent.iterdir()] == ["charter_door.py"]
