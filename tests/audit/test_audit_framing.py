"""Known answers for the auditor's framings in charter.core.framing (entry frame, RFC
6962 leaf/node, signed-note key ids, cosignature message), each re-implemented here from
the documented text and pinned, and the auditor's pure modules load no driver."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

from charter.core import framing

ROOT = Path(__file__).resolve().parents[2]
PREV = bytes(range(32))
ORIGINATOR = bytes.fromhex("00112233445566778899aabbccddeeff")
KEY = bytes(range(200, 232))


def test_entry_frame_is_the_chain_hash_preimage_and_the_leaf_input() -> None:
    frame = framing.entry_frame(PREV, 7, ORIGINATOR, 3, b"Topic/v1", b"{}")
    expected = (
        b"charter/entry/v1\x00"
        + PREV
        + struct.pack(">QH", 7, 16)
        + ORIGINATOR
        + struct.pack(">qI", 3, 8)
        + b"Topic/v1"
        + struct.pack(">I", 2)
        + b"{}"
    )
    assert frame == expected
    assert hashlib.sha256(frame).digest() == framing.entry_hash(
        PREV, 7, ORIGINATOR, 3, b"Topic/v1", b"{}"
    )
    leaf = framing.merkle_leaf_hash(frame)
    assert leaf == hashlib.sha256(b"\x00" + expected).digest()
    assert leaf.hex() == PINNED["leaf"]


def test_pinned_vectors() -> None:
    frame = framing.entry_frame(PREV, 7, ORIGINATOR, 3, b"Topic/v1", b"{}")
    got = {
        "leaf": framing.merkle_leaf_hash(frame).hex(),
        "node": framing.merkle_node_hash(PREV, bytes(32)).hex(),
        "note": framing.note_key_id("example.com/log", b"\x01", KEY).hex(),
        "cosig": framing.note_key_id("witness.example/w1", b"\x04", KEY).hex(),
        "msg": framing.cosignature_message(1679315147, b"o\n1\nAA==\n").decode(),
    }
    assert got == PINNED
    assert got["node"] == hashlib.sha256(b"\x01" + PREV + bytes(32)).hexdigest()
    assert got["note"] == hashlib.sha256(b"example.com/log\n\x01" + KEY).hexdigest()[:8]
    assert got["cosig"] == hashlib.sha256(b"witness.example/w1\n\x04" + KEY).hexdigest()[:8]
    assert got["msg"] == "cosignature/v1\ntime 1679315147\no\n1\nAA==\n"


PINNED = {
    "leaf": "ff754caf6db3ec310cbe3e80830835e2f13c297972022e2bcca232605301646d",
    "node": "4547af12ffdba3f117c9fcb2ac2a2e201b58d4e0ff8abebbeed77ae401bc4ed3",
    "note": "7d53d760",
    "cosig": "5fddf523",
    "msg": "cosignature/v1\ntime 1679315147\no\n1\nAA==\n",
}


def test_the_offline_auditor_loads_no_journal_and_no_driver(tmp_path: Path) -> None:
    probe = (
        "import charter.audit.merkle, charter.audit.note, charter.audit.bundle\n"
        "import charter.audit.proofs, charter.audit.witness, json, sys\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=True,
    )
    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert "charter" in loaded
    assert not loaded & {"eventsourcing", "psycopg", "sqlite3"}
    control = subprocess.run(
        [
            sys.executable,
            "-c",
            "from charter.ledger import Journal\n"
            "import json, sys\nprint(json.dumps(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=True,
    )
    assert "eventsourcing" in {m.split(".")[0] for m in json.loads(control.stdout)}
