"""The journal key's history: rotation events, signed by the old and the new key.

A journal starts with the key ``charter init`` made (``JournalCreated.journal_key``, the
trust anchor). ``JournalKeyRotated`` replaces it: both the current and the new key sign
``key_rotation_signing_input(origin, old, new)``. A rotation committed as leaf ``r``
makes the new key the signer of every checkpoint of size ``> r``; the origin (derived
from the first key) never changes. A rotation whose old key is not the current one, or
whose two signatures do not both verify, changes nothing (and ``charter audit`` reports
it). Pure: no journal, and no pydantic (the event itself is
:class:`~charter.audit.rotation.JournalKeyRotated`, with :func:`~charter.audit.rotation.rotation`
that makes it).
"""

from __future__ import annotations

import hmac
import json
import os
from dataclasses import dataclass, replace
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from charter.audit.errors import KeyHistoryFormatError, KeyRotationError
from charter.audit.note import NoteKey
from charter.core.errors import StateError
from charter.core.framing import NOTE_ED25519, key_rotation_signing_input
from charter.core.home import KeyStore

__all__ = [
    "JOURNAL_KEY",
    "KEY_STREAM",
    "KEY_HISTORY_FORMAT",
    "KeyHistory",
    "check_rotation",
    "is_retired",
    "journal_origin",
    "retire_key",
]

JOURNAL_KEY = "journal"  # the home's name of the journal's first signing key
KEY_STREAM = "journal-keys"
KEY_HISTORY_FORMAT = "charter/key-history@v1"
ROTATION_TOPIC = "JournalKeyRotated/"


def journal_origin(journal_key_hex: str) -> str:
    """A journal's checkpoint origin (and its note key name): ``charter.journal/`` and
    the first 16 hex digits of its first Ed25519 public key (it survives rotations)."""
    return f"charter.journal/{journal_key_hex[:16]}"


def check_rotation(payload: dict[str, Any], origin: str, current: bytes) -> bytes:
    """The new key of a valid rotation of ``current``; else :class:`KeyRotationError`."""
    try:
        old, new = bytes.fromhex(payload["old_key"]), bytes.fromhex(payload["new_key"])
        sigs = bytes.fromhex(payload["old_signature"]), bytes.fromhex(payload["new_signature"])
        claimed = str(payload["origin"])
    except (KeyError, ValueError, TypeError) as e:
        raise KeyRotationError(f"a key rotation that does not decode: {e}") from e
    if claimed != origin:
        raise KeyRotationError(f"a key rotation for {claimed!r}, not this journal ({origin})")
    if not hmac.compare_digest(old, current):
        raise KeyRotationError("a key rotation from a key that is not the journal's current key")
    statement = key_rotation_signing_input(origin, old, new)
    for key, sig, who in ((old, sigs[0], "old"), (new, sigs[1], "new")):
        try:
            VerifyKey(key).verify(statement, sig)
        except (BadSignatureError, ValueError) as e:
            raise KeyRotationError(f"a key rotation the {who} key did not sign") from e
    return new


@dataclass(frozen=True)
class KeyHistory:
    """The journal's keys: ``(after_leaf, key)``, the first with ``after_leaf = -1``."""

    origin: str
    keys: tuple[tuple[int, bytes], ...]

    @classmethod
    def start(cls, origin: str, initial: bytes) -> KeyHistory:
        return cls(origin=origin, keys=((-1, initial),))

    @property
    def current(self) -> bytes:
        return self.keys[-1][1]

    def rotated(self, leaf: int, payload: dict[str, Any]) -> KeyHistory:
        """This history after the rotation at ``leaf`` (raises if it is not valid)."""
        new = check_rotation(payload, self.origin, self.current)
        return replace(self, keys=(*self.keys, (leaf, new)))

    def key_for(self, size: int) -> bytes:
        """The key that signs a checkpoint of ``size`` entries."""
        return next(key for after, key in reversed(self.keys) if after < size)

    def up_to(self, size: int) -> KeyHistory:
        """The history as a checkpoint of ``size`` entries knows it."""
        return replace(self, keys=tuple(k for k in self.keys if k[0] < size))

    def note_key_for(self, size: int) -> NoteKey:
        return NoteKey.make(self.origin, NOTE_ED25519, self.key_for(size))

    @classmethod
    def from_document(cls, text: str, anchor: NoteKey) -> KeyHistory:
        """The history a key-history document (``charter checkpoint key --history``)
        claims, checked from ``anchor``: every rotation must be signed by the key current
        before it and by the new key (:class:`KeyRotationError` if not), at increasing
        leaves. A document that does not parse is :class:`KeyHistoryFormatError`."""
        try:
            doc = json.loads(text)
            fmt = doc["format"]
            declared = str(doc["anchor"])
            rotations = [(int(r["leaf"]), dict(r["rotation"])) for r in doc["rotations"]]
        except (ValueError, KeyError, TypeError) as e:
            raise KeyHistoryFormatError(f"the key history does not parse: {e}") from e
        if fmt != KEY_HISTORY_FORMAT:
            raise KeyHistoryFormatError(f"the key history is not a {KEY_HISTORY_FORMAT} document")
        if declared != anchor.text():
            raise KeyRotationError(
                f"the key history starts at {declared}, not at the key given ({anchor.text()})"
            )
        history = cls.start(anchor.name, anchor.public_key)
        for leaf, payload in rotations:
            if leaf <= history.keys[-1][0]:
                raise KeyRotationError(f"the key history's rotation at leaf {leaf} is out of order")
            history = history.rotated(leaf, payload)
        return history

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {"after_leaf": after, "key": NoteKey.make(self.origin, NOTE_ED25519, key).text()}
            for after, key in self.keys
        ]


# What a retired key's file holds once its private key is destroyed. The file stays, so
# the home still reads as the home of its journal (`charter init` and the missing
# journal check look for ``journal.key``), but no key can be loaded from it.
RETIRED = b"charter: retired journal key (destroyed at rotation)\n"


def _key_file(keys: KeyStore, name: str) -> Any:
    if not keys.exists(name):  # also checks the name
        raise StateError(f"no key {name!r} in {keys.directory}")
    return keys.directory / f"{name}.key"


def retire_key(keys: KeyStore, name: str) -> None:
    """Destroy the private key ``name`` after a rotation away from it: its file's bytes
    are overwritten in place and synced, then it holds only :data:`RETIRED`."""
    path = _key_file(keys, name)
    try:
        with path.open("r+b") as f:
            length = f.seek(0, os.SEEK_END)
            f.seek(0)
            f.write(b"\0" * length)
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)
            f.truncate()
            f.write(RETIRED)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise StateError(
            f"the rotation is journaled but the old key {path} could not be destroyed: {e}; "
            "delete it by hand"
        ) from e


def is_retired(keys: KeyStore, name: str) -> bool:
    try:
        return bool(_key_file(keys, name).read_bytes() == RETIRED)
    except OSError:
        return False
