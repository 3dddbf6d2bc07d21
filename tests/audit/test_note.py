"""C2SP signed notes, checkpoints and cosignatures (charter.audit.note), anchored to
published vectors of independent implementations: the Go sumdb/note example (our
signer must reproduce it byte for byte, Ed25519 being deterministic) and a real
checkpoint cosigned by a public witness (tlog-cosignature/v1)."""

from __future__ import annotations

import base64
from dataclasses import replace

import pytest
from nacl.signing import SigningKey

from charter.audit.errors import CheckpointFormatError, NoteSignatureError
from charter.audit.note import (
    Checkpoint,
    NoteKey,
    SignedNote,
    cosign,
    sign_checkpoint,
    verify_checkpoint,
    verify_cosignature,
)
from charter.core.framing import NOTE_COSIGNATURE_V1

# golang.org/x/mod/sumdb/note: the package documentation's example.
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT + "\n— PeterNeumann "
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)

# A real CT log checkpoint with witness cosignatures (tlog-cosignature/v1).
REAL = (
    "arche2025h1.staging.ct.transparency.dev\n"
    "1432088532\n"
    "U7WM79jrzyhGZ5/GUBTpM7NzwdyfFx61t3RovgcC4Ro=\n"
    "\n"
    "— arche2025h1.staging.ct.transparency.dev zTM8sQAAAZ5W0WdjBAMARjBEAiBjW5IQf9pvsYLfQFX6hoGR"
    "EPMHbdQ3urbllzalApkptQIgIpwtEroeW2BXaHAI4kJXFbon5Ch9MNL5zRNZ55lvGt0=\n"
    "— arche2025h1.staging.ct.transparency.dev ui8GwCF1+kWqZrxGdhj4aX3gcw7XUlXQQabg/27lefwhUkzb"
    "C3NygNI75MdhL1bfTW9g8Ei59RA23oHP7Ry1k3ZFWwQ=\n"
    "— remora.n621.de 2net5wAAAABqEiEgPlfF3V06o0Y+fHM+J5J9s27wgxxcOVSpZ/2g/KSiXCg9DEZI+aVCIobWX9s"
    "XTynk5XeU/zZ0WBxtqB0DrAWfBw==\n"
)
REMORA = "remora.n621.de+da77ade7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2"


def _go_key() -> SigningKey:
    return SigningKey(base64.b64decode(GO_SKEY.split("+", 4)[4])[1:])


def test_signing_reproduces_the_go_reference_note_byte_for_byte() -> None:
    key = _go_key()
    vkey = NoteKey.parse(GO_VKEY)
    assert NoteKey.of("PeterNeumann", key).text() == GO_VKEY
    note = SignedNote(text=GO_TEXT, signatures=()).add(vkey, key.sign(GO_TEXT.encode()).signature)
    assert note.render() == GO_NOTE
    assert SignedNote.parse(GO_NOTE) == note


def test_a_real_witness_cosignature_verifies_and_a_changed_checkpoint_does_not() -> None:
    note = SignedNote.parse(REAL)
    witness = NoteKey.parse(REMORA)
    assert witness.type == NOTE_COSIGNATURE_V1
    assert verify_cosignature(note, witness) > 1_700_000_000
    assert Checkpoint.parse(note.text).size == 1432088532
    changed = SignedNote.parse(REAL.replace("1432088532", "1432088533"))
    with pytest.raises(NoteSignatureError):
        verify_cosignature(changed, witness)


def _checkpoint() -> Checkpoint:
    return Checkpoint(origin="charter.example/j1", size=42, root=bytes(range(32)))


def test_checkpoint_round_trip_and_refusals() -> None:
    key, other = SigningKey.generate(), SigningKey.generate()
    note = sign_checkpoint(_checkpoint(), "charter.example/j1", key)
    text = note.render()
    assert text.startswith("charter.example/j1\n42\n" + base64.b64encode(bytes(range(32))).decode())
    vkey = NoteKey.of("charter.example/j1", key)
    assert verify_checkpoint(SignedNote.parse(text), vkey) == _checkpoint()
    # signed by another key under the same name: refused
    forged = sign_checkpoint(_checkpoint(), "charter.example/j1", other).render()
    with pytest.raises(NoteSignatureError, match="no signature"):
        verify_checkpoint(SignedNote.parse(forged), vkey)
    # a signature line that claims the right key id but carries another key's signature
    line = SignedNote.parse(text).signatures[0]
    swapped = SignedNote.parse(forged).signatures[0].signature
    bad = SignedNote(text=note.text, signatures=(replace(line, signature=swapped),))
    with pytest.raises(NoteSignatureError, match="does not verify"):
        verify_checkpoint(bad, vkey)
    # every altered line of the text is refused
    for i, line_text in enumerate(note.text.splitlines()):
        lines = note.text.splitlines()
        lines[i] = line_text[:-1] + ("A" if line_text[-1] != "A" else "B")
        altered = "\n".join(lines) + "\n\n" + "".join(s.line() for s in note.signatures)
        with pytest.raises((NoteSignatureError, CheckpointFormatError)):
            verify_checkpoint(SignedNote.parse(altered), vkey)
    # a note for another log (origin) under a key of this name is refused
    foreign = sign_checkpoint(replace(_checkpoint(), origin="elsewhere"), "charter.example/j1", key)
    with pytest.raises(NoteSignatureError, match="origin"):
        verify_checkpoint(foreign, vkey)


def test_cosignature_round_trip_and_refusals() -> None:
    log, witness = SigningKey.generate(), SigningKey.generate()
    note = sign_checkpoint(_checkpoint(), "charter.example/j1", log)
    cosigned = cosign(note, witness, "witness.example/w", 1_700_000_000)
    wkey = NoteKey.of("witness.example/w", witness, NOTE_COSIGNATURE_V1)
    parsed = SignedNote.parse(cosigned.render())
    assert verify_cosignature(parsed, wkey) == 1_700_000_000
    verify_checkpoint(parsed, NoteKey.of("charter.example/j1", log))  # log signature kept
    blob = parsed.matching(wkey)[0]
    later = replace(blob, signature=(1_700_000_001).to_bytes(8, "big") + blob.signature[8:])
    with pytest.raises(NoteSignatureError):
        verify_cosignature(replace(parsed, signatures=(later,)), wkey)
    with pytest.raises(NoteSignatureError):  # a note key is not a cosignature key
        verify_cosignature(parsed, NoteKey.of("witness.example/w", witness))


@pytest.mark.parametrize(
    "text",
    [
        "no blank line\n— a AAAAAAA=\n",
        "o\n1\nAA==\n\n— a !!!!\n",
        "o\n1\nAA==\n\nnot a signature line\n",
        "o\n1\nAA==\n\n— a AAAAAAA=",
        "o\x07\n1\nAA==\n\n— a AAAAAAA=\n",
    ],
)
def test_malformed_notes_are_refused(text: str) -> None:
    with pytest.raises(CheckpointFormatError):
        SignedNote.parse(text)


@pytest.mark.parametrize(
    "body",
    ["o\n01\n" + "A" * 43 + "=\n", "o\n1\nAAAA\n", "o\n1\n", "o\n\n" + "A" * 43 + "=\n"],
)
def test_malformed_checkpoints_are_refused(body: str) -> None:
    with pytest.raises(CheckpointFormatError):
        Checkpoint.parse(body)


def test_malformed_verifier_keys_are_refused() -> None:
    for bad in (
        GO_VKEY.replace("c74f20a3", "c74f20a4"),
        "name+zz+AAAA",
        "a b+00000000+" + "A" * 44,
    ):
        with pytest.raises(CheckpointFormatError):
            NoteKey.parse(bad)
