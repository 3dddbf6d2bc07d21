"""A witness: cosigns a log's checkpoint only if it consistently extends the last one
it cosigned for that log (C2SP tlog-cosignature/v1), and refuses a fork or a rollback.

Its key is the Charter home's key ``witness`` (``keys/witness.key``, like every key);
its name and state live in ``witness/`` in the home: ``name`` (its key name) and
``state/<sha256(origin)[:16]>.note``, the last checkpoint it cosigned per log, replaced
atomically.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

from nacl.signing import SigningKey

from charter.audit import merkle
from charter.audit.errors import (
    ConsistencyProofError,
    WitnessForkError,
    WitnessRollbackError,
)
from charter.audit.note import (
    Checkpoint,
    NoteKey,
    SignedNote,
    cosign,
    verify_checkpoint,
)
from charter.core.errors import BadInputError, KeyNotFoundError
from charter.core.framing import NOTE_COSIGNATURE_V1
from charter.core.home import KeyStore

__all__ = ["WITNESS_KEY", "Witness"]


WITNESS_KEY = "witness"


class Witness:
    """The witness of one Charter home."""

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys
        self.directory = keys.home / "witness"

    def init(self, name: str) -> NoteKey:
        """Make the witness's key (once); return its verifier key."""
        NoteKey.make(name, NOTE_COSIGNATURE_V1, bytes(32))  # checks the name
        key = self.keys.create(WITNESS_KEY)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.directory / "name").write_text(name + "\n")
        return NoteKey.of(name, key, NOTE_COSIGNATURE_V1)

    def _load(self) -> tuple[str, SigningKey]:
        key = self.keys.load(WITNESS_KEY)
        try:
            name = (self.directory / "name").read_text().strip()
        except FileNotFoundError:
            raise KeyNotFoundError(
                f"no witness in {self.keys.home}; run `charter witness init --name NAME`"
            ) from None
        return name, key

    def verifier_key(self) -> NoteKey:
        name, key = self._load()
        return NoteKey.of(name, key, NOTE_COSIGNATURE_V1)

    def _state_path(self, origin: str) -> Path:
        digest = hashlib.sha256(origin.encode()).hexdigest()[:16]
        return self.directory / "state" / f"{digest}.note"

    def last(self, origin: str) -> SignedNote | None:
        path = self._state_path(origin)
        return SignedNote.parse(path.read_text()) if path.exists() else None

    def cosign(
        self,
        note: SignedNote,
        log_key: NoteKey,
        proof: Sequence[bytes] | None,
        *,
        now: int | None = None,
    ) -> SignedNote:
        """Verify the log's signature and the consistency with the last cosigned
        checkpoint of this log, then cosign and remember it. ``proof`` is the RFC 6962
        consistency proof from the last cosigned size to this one (None for the first
        checkpoint of a log, or when the size is unchanged)."""
        name, key = self._load()
        checkpoint = verify_checkpoint(note, log_key)
        last = self.last(checkpoint.origin)
        if last is not None:
            self._check_extends(Checkpoint.parse(last.text), checkpoint, proof)
        cosigned = cosign(note, key, name, int(time.time()) if now is None else now)
        self._save(checkpoint.origin, cosigned)
        return cosigned

    @staticmethod
    def _check_extends(old: Checkpoint, new: Checkpoint, proof: Sequence[bytes] | None) -> None:
        if new.size < old.size:
            raise WitnessRollbackError(
                f"refusing to cosign {new.origin} at size {new.size}: it already cosigned "
                f"size {old.size} (a rollback)"
            )
        if new.size > old.size and proof is None:
            raise BadInputError(
                f"a consistency proof from size {old.size} to {new.size} is needed "
                "(give --proof FILE, or --db of the journal)"
            )
        try:
            merkle.verify_consistency(old.size, new.size, old.root, new.root, proof or ())
        except ConsistencyProofError as e:
            raise WitnessForkError(
                f"refusing to cosign {new.origin} at size {new.size}: it is not a consistent "
                f"extension of size {old.size}, which it cosigned (a fork): {e}"
            ) from e

    def _save(self, origin: str, note: SignedNote) -> None:
        path = self._state_path(origin)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(note.render())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
