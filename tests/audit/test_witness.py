"""The witness in-process: it keeps the last cosigned checkpoint per log, asks for a
consistency proof to move on, and refuses forks and rollbacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from nacl.signing import SigningKey

from charter.audit import merkle
from charter.audit.errors import NoteSignatureError, WitnessForkError, WitnessRollbackError
from charter.audit.note import Checkpoint, NoteKey, sign_checkpoint, verify_cosignature
from charter.audit.witness import Witness
from charter.core import KeyStore
from charter.core.errors import BadInputError, KeyNotFoundError, StateError
from tests.audit import rfc6962

ORIGIN = "charter.journal/test"


def _tree(tag: str, n: int) -> list[bytes]:
    return [rfc6962.leaf(f"{tag}{i}".encode()) for i in range(n)]


def _note(log: SigningKey, leaves: list[bytes]):  # type: ignore[no-untyped-def]
    cp = Checkpoint(origin=ORIGIN, size=len(leaves), root=merkle.root_from_leaves(leaves))
    return sign_checkpoint(cp, ORIGIN, log)


def _proof(leaves: list[bytes], old: int) -> tuple[bytes, ...]:
    nodes = {(lv, ix): h for lv, ix, h in merkle.append_leaves([], 0, leaves)}
    return merkle.consistency_proof(merkle.from_mapping(nodes), old, len(leaves))


def test_cosigns_extensions_and_refuses_forks_and_rollbacks(tmp_path: Path) -> None:
    log = SigningKey.generate()
    log_key = NoteKey.of(ORIGIN, log)
    w = Witness(KeyStore(tmp_path / "home"))
    with pytest.raises(KeyNotFoundError):
        w.verifier_key()
    wkey = w.init("witness.example/w")
    with pytest.raises(StateError):
        w.init("witness.example/w")  # once
    honest = _tree("a", 40)
    first = w.cosign(_note(log, honest[:10]), log_key, None, now=100)
    assert verify_cosignature(first, wkey) == 100
    with pytest.raises(BadInputError, match="consistency proof"):
        w.cosign(_note(log, honest[:20]), log_key, None)
    w.cosign(_note(log, honest[:20]), log_key, _proof(honest[:20], 10))
    assert Checkpoint.parse(w.last(ORIGIN).text).size == 20  # type: ignore[union-attr]
    # the same size again is fine; a smaller one is a rollback
    w.cosign(_note(log, honest[:20]), log_key, None)
    with pytest.raises(WitnessRollbackError):
        w.cosign(_note(log, honest[:15]), log_key, None)
    # a fork: shares the first 20 leaves... then differs; the proof is of the fork's tree
    fork = honest[:18] + _tree("b", 22)
    with pytest.raises(WitnessForkError):
        w.cosign(_note(log, fork), log_key, _proof(fork, 20))
    # a same-size fork (another root at the size it cosigned)
    with pytest.raises(WitnessForkError):
        w.cosign(_note(log, fork[:20]), log_key, None)
    # a checkpoint signed by another key under the log's name
    with pytest.raises(NoteSignatureError):
        w.cosign(_note(SigningKey.generate(), honest), log_key, _proof(honest, 20))
    # the state did not move through any of the refusals
    assert Checkpoint.parse(w.last(ORIGIN).text).size == 20  # type: ignore[union-attr]
    w.cosign(_note(log, honest), log_key, _proof(honest, 20))
    assert Checkpoint.parse(w.last(ORIGIN).text).size == 40  # type: ignore[union-attr]
