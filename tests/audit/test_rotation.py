"""Journal key rotation (SQLite and PostgreSQL): the old and the new key both sign it;
checkpoints past it are signed by the new key and verify from the first key through the
rotation; bundles carry the rotation; a rotation not signed by the current key changes
nothing, is a finding, and a checkpoint by its key is refused."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from charter.audit.bundle import seal_signing_input, verify_bundle
from charter.audit.errors import KeyRotationError, NoteSignatureError
from charter.audit.export import export_bundle
from charter.audit.keys import KeyHistory
from charter.audit.note import Checkpoint, NoteKey, SignedNote, sign_checkpoint
from charter.audit.rotation import rotation
from charter.audit.semantic import audit_history
from charter.audit.tree import MerkleLog, verify_extension
from charter.core import KeyStore
from charter.core.errors import CharterError
from charter.ledger import Journal
from tests.audit._support import fill_real
from tests.audit.test_cli_audit import charter, ok
from tests.audit.test_export import _entries, _fails_at, _join, _lines


def test_a_rotation_needs_both_signatures_and_the_current_key() -> None:
    old, new, stranger = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    history = KeyHistory.start("o", bytes(old.verify_key))
    good = rotation("o", old, new).payload()
    assert history.rotated(4, good).key_for(5) == bytes(new.verify_key)
    assert history.rotated(4, good).key_for(4) == bytes(old.verify_key)
    for bad in (
        rotation("o", stranger, new).payload(),  # not from the current key
        {**good, "new_signature": rotation("o", old, stranger).payload()["new_signature"]},
        {**good, "old_signature": "00" * 64},
        {**good, "origin": "another"},
    ):
        with pytest.raises(KeyRotationError):
            history.rotated(4, bad)


def test_checkpoints_verify_across_a_rotation(journal_url: str, tmp_path: Path) -> None:
    home, witness_home = tmp_path / "home", tmp_path / "witness"
    ok(charter("init", home=home, db=journal_url))
    anchor = ok(charter("checkpoint", "key", home=home, db=journal_url)).strip()
    cp1 = tmp_path / "cp1"
    ok(charter("checkpoint", "--out", str(cp1), home=home, db=journal_url))
    ok(charter("witness", "init", "--name", "w.example", home=witness_home))
    ok(charter("witness", "cosign", str(cp1), "--log-key", anchor, home=witness_home))

    new_key = ok(charter("checkpoint", "rotate", home=home, db=journal_url)).strip()
    assert new_key != anchor
    assert (home / "keys" / "journal.1.key").exists()
    current = ok(charter("checkpoint", "key", "--current", home=home, db=journal_url)).strip()
    assert current == new_key
    with Journal.open(journal_url) as j:
        fill_real(j, 3, tag="after")
    cp2 = tmp_path / "cp2"
    ok(charter("checkpoint", "--out", str(cp2), home=home, db=journal_url))
    note2 = SignedNote.parse(cp2.read_text())
    assert note2.matching(NoteKey.parse(new_key))
    assert not note2.matching(NoteKey.parse(anchor))
    for cp in (cp1, cp2):  # both verify from the first key, through the rotation
        report = ok(charter("--json", "checkpoint", "verify", str(cp), home=home, db=journal_url))
        assert json.loads(report)["ok"] is True
        ok(
            charter(
                "checkpoint", "verify", str(cp), "--journal-key", anchor, home=home, db=journal_url
            )
        )
    # the witness goes on with the log's new key (same origin, consistent tree)
    ok(
        charter(
            "witness", "cosign", str(cp2), "--log-key", new_key, home=witness_home, db=journal_url
        )
    )
    # a bundle across the rotation verifies from the first key; it carries the rotation
    with Journal.open(journal_url) as j:
        keys = KeyStore(home)
        out = io.BytesIO()
        export_bundle(j, keys.load("journal.1"), out, start=5)
    lines = _lines(out.getvalue())
    assert any(e.type_name == "JournalKeyRotated" for e in _entries(lines))
    assert len(lines[0]["keys"]) == 2
    report = verify_bundle(out.getvalue(), NoteKey.parse(anchor))
    assert report.checkpoint_size > 0
    header = lines[0]
    # the key history cut back to the first key: the new key's checkpoint is refused
    cut = {**header, "keys": header["keys"][:1]}
    _fails_at(_join([cut, *lines[1:]]), NoteKey.parse(anchor), "checkpoint")
    # a history naming an attacker's key, which signs the checkpoint and the seal: the
    # rotation entry, signed by the first key, names another key: refused at the keys
    attacker = SigningKey.generate()
    name = NoteKey.parse(anchor).name
    fake = NoteKey.make(name, b"\x01", bytes(attacker.verify_key)).text()
    text = SignedNote.parse(header["checkpoint"]).text
    note = sign_checkpoint(Checkpoint.parse(text), name, attacker).render()
    forged = [
        {
            **header,
            "keys": [header["keys"][0], {**header["keys"][1], "key": fake}],
            "checkpoint": note,
        },
        *lines[1:-1],
    ]
    body = _join(forged)
    seal = attacker.sign(seal_signing_input(hashlib.sha256(body).digest())).signature
    trailer = {**lines[-1], "seal": base64.b64encode(seal).decode()}
    _fails_at(body + _join([trailer]), NoteKey.parse(anchor), "keys")
    assert ok(charter("audit", home=home, db=journal_url)).startswith("ok:")


def test_a_rotation_by_a_stranger_changes_nothing_and_is_found(
    journal_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    ok(charter("init", home=home, db=journal_url))
    stranger, evil = SigningKey.generate(), SigningKey.generate()
    with Journal.open(journal_url) as j:
        log = MerkleLog(j)
        (forged,) = j.append([rotation(log.origin, stranger, evil)])
        fill_real(j, 2, tag="later")
        size = log.catch_up()
        assert log.history().current == log.initial  # the forged rotation changed nothing
        root = log.root()[1]
        evil_note = sign_checkpoint(
            Checkpoint(origin=log.origin, size=size, root=root), log.origin, evil
        )
        with pytest.raises(NoteSignatureError):
            verify_extension(j, evil_note)
        good = log.checkpoint(KeyStore(home).load("journal"))
        verify_extension(j, good)  # positive control: the journal's own key still signs
        report = audit_history(j.payloads())
    assert [(f.check, f.position) for f in report.findings] == [("key-rotation", forged.position)]
    found = charter("--json", "audit", home=home, db=journal_url)
    refused_doc = json.loads(found.stdout)
    assert found.returncode == 3
    assert refused_doc["findings"][0]["check"] == "key-rotation"


def test_a_rotation_destroys_the_old_private_key(journal_url: str, tmp_path: Path) -> None:
    """Before, the old key stayed in the home beside the new one (and still signed the
    checkpoints of sizes up to the rotation). Now the rotation publishes the old key's
    last checkpoint, then destroys it: no file of the home holds it, and nothing signs
    with it afterwards."""
    home = tmp_path / "home"
    ok(charter("init", home=home, db=journal_url))
    old = KeyStore(home).load("journal")
    secret = bytes(old).hex()
    anchor = ok(charter("checkpoint", "key", home=home, db=journal_url)).strip()
    with Journal.open(journal_url) as j:
        size_before = len(list(j.rows()))
    ok(charter("checkpoint", "rotate", home=home, db=journal_url))
    leftovers = [p for p in home.rglob("*") if p.is_file() and secret in p.read_bytes().hex()]
    leftovers += [p for p in home.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leftovers == []
    assert (home / "keys" / "journal.key").exists()  # the home still reads as this journal's
    with pytest.raises(CharterError):
        KeyStore(home).load("journal")
    # The old key's last checkpoint was published before the rotation, and verifies.
    with Journal.open(journal_url) as j:
        log = MerkleLog(j)
        with log.store.read() as cur:
            notes = {size: note for size, note, _ in log.store.checkpoints(cur, limit=100)}
    last_old = SignedNote.parse(notes[size_before])
    assert last_old.matching(NoteKey.parse(anchor))
    # Nothing signs a checkpoint of an old size any more (only the old key could).
    refused = charter(
        "proof", "inclusion", "1", "--size", str(size_before), home=home, db=journal_url
    )
    assert refused.returncode != 0
    assert "signing key" in refused.stderr
    # Positive control: the new key signs the tree as it stands.
    ok(charter("checkpoint", home=home, db=journal_url))
    ok(charter("proof", "inclusion", "1", home=home, db=journal_url))


def test_proofs_and_the_witness_follow_a_key_history_from_the_anchor(
    journal_url: str, tmp_path: Path
) -> None:
    """An auditor who holds only the anchor verifies a proof, and a witness cosigns a
    checkpoint, signed by a rotated key, given the key history (each rotation signed by
    both keys); a history with a forged rotation is refused (exit 3)."""
    home, witness_home = tmp_path / "home", tmp_path / "witness"
    ok(charter("init", home=home, db=journal_url))
    anchor = ok(charter("checkpoint", "key", home=home, db=journal_url)).strip()
    cp1 = tmp_path / "cp1"
    ok(charter("checkpoint", "--out", str(cp1), home=home, db=journal_url))
    ok(charter("witness", "init", "--name", "w.example", home=witness_home))
    ok(charter("witness", "cosign", str(cp1), "--log-key", anchor, home=witness_home))
    ok(charter("checkpoint", "rotate", home=home, db=journal_url))
    with Journal.open(journal_url) as j:
        fill_real(j, 2, tag="after")
    proof = tmp_path / "proof"
    proof.write_text(ok(charter("proof", "inclusion", "2", home=home, db=journal_url)))
    cp2 = tmp_path / "cp2"
    ok(charter("checkpoint", "--out", str(cp2), home=home, db=journal_url))
    history = tmp_path / "keys.json"
    ok(charter("checkpoint", "key", "--history", str(history), home=home, db=journal_url))
    # Without the history the anchor alone does not verify the new key's signature.
    assert (
        charter("proof", "verify", str(proof), "--journal-key", anchor, home=home).returncode == 3
    )
    with_history = ("--journal-key", anchor, "--key-history", str(history))
    ok(charter("proof", "verify", str(proof), *with_history, home=home))
    ok(
        charter(
            "witness",
            "cosign",
            str(cp2),
            "--log-key",
            anchor,
            "--key-history",
            str(history),
            home=witness_home,
            db=journal_url,
        )
    )
    # A history whose rotation a stranger signed (to the stranger's key) is refused.
    doc = json.loads(history.read_text())
    stranger, evil = SigningKey.generate(), SigningKey.generate()
    origin = NoteKey.parse(anchor).name
    forged = {
        **doc,
        "rotations": [{"leaf": 3, "rotation": rotation(origin, stranger, evil).payload()}],
    }
    bad = tmp_path / "forged.json"
    bad.write_text(json.dumps(forged))
    got = charter(
        "proof", "verify", str(proof), "--journal-key", anchor, "--key-history", str(bad), home=home
    )
    assert got.returncode == 3, got.stderr
    other = NoteKey.make(origin, b"\x01", bytes(range(32))).text()
    got = charter(
        "proof",
        "verify",
        str(proof),
        "--journal-key",
        other,
        "--key-history",
        str(history),
        home=home,
    )
    assert got.returncode == 3, got.stderr
    bad.write_text("{not json")
    got = charter(
        "proof", "verify", str(proof), *with_history[:2], "--key-history", str(bad), home=home
    )
    assert got.returncode == 2, got.stderr
