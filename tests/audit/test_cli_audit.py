"""The auditor's commands end to end (SQLite and PostgreSQL): checkpoint, checkpoint
verify, witness init/cosign, proof inclusion/consistency/verify; forks, rollbacks and
rewritten histories exit 3 with a message naming what was refused."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from charter.audit import merkle
from charter.audit.note import NoteKey, SignedNote, verify_checkpoint, verify_cosignature
from charter.audit.proofs import ConsistencyText
from charter.ledger import Journal
from tests.audit._support import _Raw, fill, rehash_from

ROOT = Path(__file__).resolve().parents[2]


def charter(
    *args: str, home: Path, db: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "CHARTER_DB"}
    extra = {"CHARTER_DB": db} if db else {}
    return subprocess.run(
        [sys.executable, "-m", "charter", *args],
        capture_output=True,
        text=True,
        cwd=home.parent,
        env={**base, "CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT), **extra, **(env or {})},
        timeout=180,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 3, (result.returncode, result.stdout, result.stderr)
    message = result.stderr.strip()
    assert message.startswith("charter: error: "), message
    for word in words:
        assert word in message, message
    return message


@pytest.fixture
def journal_home(journal_url: str, tmp_path: Path) -> tuple[str, Path]:
    home = tmp_path / "home"
    ok(charter("init", home=home, db=journal_url))
    return journal_url, home


def _grow(url: str, batches: int, tag: str) -> None:
    with Journal.open(url) as j:
        fill(j, batches, tag=tag)


def test_checkpoint_witness_and_verify_round_trip(journal_home: tuple, tmp_path: Path) -> None:
    url, home = journal_home
    vkey = ok(charter("checkpoint", "key", home=home, db=url)).strip()
    cp1 = tmp_path / "cp1"
    printed = ok(charter("checkpoint", "--out", str(cp1), home=home, db=url))
    assert printed == cp1.read_text()
    first = verify_checkpoint(SignedNote.parse(printed), NoteKey.parse(vkey))
    with Journal.open(url) as j:
        assert first.size == len(list(j.rows()))

    witness_home = tmp_path / "witness"
    wkey = ok(charter("witness", "init", "--name", "witness.example/w1", home=witness_home))
    cosigned = ok(charter("witness", "cosign", str(cp1), "--log-key", vkey, home=witness_home))
    assert verify_cosignature(SignedNote.parse(cosigned), NoteKey.parse(wkey.strip())) > 0

    _grow(url, 4, "more")
    cp2 = tmp_path / "cp2"
    doc = json.loads(ok(charter("--json", "checkpoint", "--out", str(cp2), home=home, db=url)))
    assert doc["size"] > first.size
    # the witness asks the journal for the consistency proof from size 1 to size 2
    ok(charter("witness", "cosign", str(cp2), "--log-key", vkey, home=witness_home, db=url))
    # checkpoint verify: the grown journal extends the first checkpoint
    report = json.loads(ok(charter("--json", "checkpoint", "verify", str(cp1), home=home, db=url)))
    assert report["ok"] is True
    assert report["checkpoint_size"] == first.size

    # a rollback (the older checkpoint again) is refused
    refused(
        charter("witness", "cosign", str(cp1), "--log-key", vkey, home=witness_home),
        "rollback",
    )
    # consistency proof text verifies between the two checkpoints' roots
    text = ok(charter("proof", "consistency", str(first.size), str(doc["size"]), home=home, db=url))
    parsed = ConsistencyText.parse(text)
    second = verify_checkpoint(SignedNote.parse(cp2.read_text()), NoteKey.parse(vkey))
    merkle.verify_consistency(first.size, second.size, first.root, second.root, parsed.path)


def test_inclusion_proof_verifies_offline_and_a_flipped_byte_is_refused(
    journal_home: tuple, tmp_path: Path
) -> None:
    url, home = journal_home
    _grow(url, 3, "x")
    vkey = ok(charter("checkpoint", "key", home=home, db=url)).strip()
    with Journal.open(url) as j:
        position = [r.position for r in j.rows()][4]
    text = ok(charter("proof", "inclusion", str(position), home=home, db=url))
    assert text.startswith("c2sp.org/tlog-proof@v1\nextra ")
    good = tmp_path / "good.tlog-proof"
    good.write_text(text)
    empty_home = tmp_path / "nohome"
    offline = {"CHARTER_DB": "postgresql://nobody@127.0.0.1:1/none"}
    result = charter(
        "proof", "verify", str(good), "--journal-key", vkey, home=empty_home, env=offline
    )
    assert ok(result).startswith("ok: entry 4 ")
    assert not empty_home.exists()  # no home was made or needed
    lines = text.split("\n")
    for i in (1, 3, len(lines) - 2):  # the entry, a path hash, the checkpoint signature
        raw = lines[i].split(" ")[-1]
        data = bytearray(base64.b64decode(raw))
        data[len(data) // 2] ^= 1
        changed = lines[:]
        changed[i] = lines[i][: len(lines[i]) - len(raw)] + base64.b64encode(bytes(data)).decode()
        bad = tmp_path / f"bad{i}"
        bad.write_text("\n".join(changed))
        refused(charter("proof", "verify", str(bad), "--journal-key", vkey, home=empty_home))


def test_a_rewritten_history_fails_checkpoint_verify(journal_home: tuple, tmp_path: Path) -> None:
    url, home = journal_home
    _grow(url, 3, "y")
    cp = tmp_path / "cp"
    ok(charter("checkpoint", "--out", str(cp), home=home, db=url))
    ok(charter("checkpoint", "verify", str(cp), home=home, db=url))  # positive control
    with Journal.open(url) as j:
        positions = [r.position for r in j.rows()]
    with _Raw(url) as raw:
        raw.drop_guards()
        rehash_from(url, raw, positions[2], b"{}")
    refused(charter("checkpoint", "verify", str(cp), home=home, db=url), "rewritten")
    result = charter("--json", "checkpoint", "verify", str(cp), home=home, db=url)
    assert result.returncode == 3


def test_the_witness_refuses_a_fork(journal_home: tuple, tmp_path: Path) -> None:
    """The log shows the witness one history, then cuts its tail and shows another with
    the same prefix (rebuilding its tree and signing with its own key)."""
    url, home = journal_home
    _grow(url, 2, "shared")
    vkey = ok(charter("checkpoint", "key", home=home, db=url)).strip()
    witness_home = tmp_path / "witness"
    ok(charter("witness", "init", "--name", "w.example", home=witness_home))
    cp0 = tmp_path / "cp0"
    ok(charter("checkpoint", "--out", str(cp0), home=home, db=url))
    ok(charter("witness", "cosign", str(cp0), "--log-key", vkey, home=witness_home))
    with Journal.open(url) as j:
        prefix_end = j.head()[0]
    _grow(url, 3, "honest")
    cp1 = tmp_path / "cp1"
    ok(charter("checkpoint", "--out", str(cp1), home=home, db=url))
    ok(charter("witness", "cosign", str(cp1), "--log-key", vkey, home=witness_home, db=url))

    with _Raw(url) as raw:  # the fork: same prefix, another tail
        raw.drop_guards()
        raw.execute(f"DELETE FROM {raw.table} WHERE {raw.pos} > ?", (prefix_end,))
        raw.execute("DELETE FROM charter_merkle_leaves")
        raw.execute("DELETE FROM charter_merkle_nodes")
        tracking = "tracking" if raw.sqlite else "charter_tracking"
        raw.execute(f"DELETE FROM {tracking} WHERE application_name = 'charter.audit.merkle'")
    _grow(url, 4, "forked")
    cp2 = tmp_path / "cp2"
    ok(charter("checkpoint", "--out", str(cp2), home=home, db=url))
    ok(charter("checkpoint", "verify", str(cp0), home=home, db=url))  # the prefix holds
    refused(charter("checkpoint", "verify", str(cp1), home=home, db=url))
    refused(
        charter("witness", "cosign", str(cp2), "--log-key", vkey, home=witness_home, db=url),
        "fork",
    )


def test_export_writes_a_bundle_that_export_verify_accepts(
    journal_home: tuple, tmp_path: Path
) -> None:
    url, home = journal_home
    _grow(url, 2, "z")
    vkey = ok(charter("checkpoint", "key", home=home, db=url)).strip()
    out = tmp_path / "b.json"
    doc = json.loads(
        ok(charter("--json", "export", str(out), "--from", "2", "--to", "4", home=home, db=url))
    )
    assert doc["entries"] == 3
    report = json.loads(
        ok(charter("--json", "export", "verify", str(out), "--journal-key", vkey, home=home))
    )
    assert report["ok"] is True
    assert report["entries"] == 3
    bad = charter("export", str(out), "--from", "5", "--to", "4", home=home, db=url)
    assert bad.returncode == 2, bad.stderr


def test_journal_verify_with_a_checkpoint_catches_what_the_chain_walk_cannot(
    journal_home: tuple, tmp_path: Path
) -> None:
    url, home = journal_home
    _grow(url, 3, "z")
    cp = tmp_path / "cp"
    ok(charter("checkpoint", "--out", str(cp), home=home, db=url))
    out = json.loads(
        ok(charter("--json", "journal", "verify", "--checkpoint", str(cp), home=home, db=url))
    )
    assert out["ok"] is True
    assert out["checkpoint"]["checkpoint_size"] == out["checked"]
    with Journal.open(url) as j:
        positions = [r.position for r in j.rows()]
    with _Raw(url) as raw:
        raw.drop_guards()
        rehash_from(url, raw, positions[1], b"{}")
    # The consistent re-hash leaves a chain that walks clean: the chain walk alone misses it.
    ok(charter("journal", "verify", home=home, db=url))
    refused(charter("journal", "verify", "--checkpoint", str(cp), home=home, db=url), "rewritten")


def test_the_witness_refuses_a_second_journal_that_shares_a_prefix(tmp_path: Path) -> None:
    """Two journals with one key and one prefix (a copy of the file taken at a cosigned
    checkpoint, each then written on its own): the witness that cosigned the first one's
    extension refuses the second's, as a fork."""
    home = tmp_path / "home"
    first = f"sqlite:///{tmp_path / 'a.db'}"
    ok(charter("init", home=home, db=first))
    _grow(first, 2, "shared")
    vkey = ok(charter("checkpoint", "key", home=home, db=first)).strip()
    witness_home = tmp_path / "witness"
    ok(charter("witness", "init", "--name", "w.example", home=witness_home))
    cp0 = tmp_path / "cp0"
    ok(charter("checkpoint", "--out", str(cp0), home=home, db=first))
    ok(charter("witness", "cosign", str(cp0), "--log-key", vkey, home=witness_home))
    second = f"sqlite:///{tmp_path / 'b.db'}"
    with sqlite3.connect(tmp_path / "a.db") as src, sqlite3.connect(tmp_path / "b.db") as dst:
        src.backup(dst)  # the same bytes, key and tree: one history so far
    _grow(first, 3, "honest")
    _grow(second, 4, "forked")
    cp1, cp2 = tmp_path / "cp1", tmp_path / "cp2"
    ok(charter("checkpoint", "--out", str(cp1), home=home, db=first))
    ok(charter("checkpoint", "--out", str(cp2), home=home, db=second))
    # Each journal alone extends the shared checkpoint: only a witness sees the fork.
    ok(charter("checkpoint", "verify", str(cp0), home=home, db=second))
    ok(charter("witness", "cosign", str(cp1), "--log-key", vkey, home=witness_home, db=first))
    # Positive control: the second journal's checkpoint would be cosigned by a witness
    # that had seen only the shared prefix.
    fresh = tmp_path / "fresh-witness"
    ok(charter("witness", "init", "--name", "w2.example", home=fresh))
    ok(charter("witness", "cosign", str(cp0), "--log-key", vkey, home=fresh))
    ok(charter("witness", "cosign", str(cp2), "--log-key", vkey, home=fresh, db=second))
    refused(
        charter("witness", "cosign", str(cp2), "--log-key", vkey, home=witness_home, db=second),
        "fork",
    )


def test_checkpoint_refuses_to_sign_past_the_journals_head(journal_home: tuple) -> None:
    """A tail cut with the stored tree left intact: before, `charter checkpoint` signed
    the tree's size, larger than the journal; now it refuses (exit 3), and so do proofs."""
    url, home = journal_home
    _grow(url, 3, "z")
    note = ok(charter("checkpoint", home=home, db=url))  # positive control: the tree is built
    size = int(note.split("\n")[1])
    ok(charter("proof", "inclusion", "1", home=home, db=url))
    with Journal.open(url) as j:
        positions = [r.position for r in j.rows()]
    assert len(positions) == size
    with _Raw(url) as raw:
        raw.drop_guards()
        raw.execute(f"DELETE FROM {raw.table} WHERE {raw.pos} >= ?", (positions[-2],))
    refused(charter("checkpoint", home=home, db=url), "tail was cut")
    refused(charter("proof", "inclusion", "1", home=home, db=url), "tail was cut")
