"""C2SP signed notes, tlog checkpoints and tlog cosignatures (Ed25519), pure.

A signed note is its text (UTF-8, every line newline-terminated), a blank line, then one
signature line per signer: ``— <key name> base64(key id ‖ signature)``. The key id is
``sha256(name ‖ 0x0A ‖ type ‖ public key)[:4]`` with type 0x01 for a note signature
(Ed25519 over the text) and 0x04 for a tlog-cosignature/v1 (Ed25519 over
``cosignature/v1\\ntime T\\n`` ‖ text, the signature prefixed by T as a big-endian u64).
A checkpoint's text is the origin line, the tree size in decimal, the base64 root hash,
then optional extension lines. A verifier key is ``name+hexid+base64(type ‖ key)``.

Verification is fail-closed: a note verifies for a key only if a signature line with that
key's name and id is present and its signature is valid; other signers' lines are kept
but never trusted.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from charter.audit.errors import CheckpointFormatError, NoteSignatureError, VerifierKeyError
from charter.core.framing import (
    HASH_SIZE,
    NOTE_COSIGNATURE_V1,
    NOTE_ED25519,
    cosignature_message,
    note_key_id,
)

__all__ = [
    "Checkpoint",
    "NoteKey",
    "SignedNote",
    "cosign",
    "sign_checkpoint",
    "verify_checkpoint",
    "verify_cosignature",
]

_DASH = "\u2014 "  # EM DASH, space: the start of every signature line
_NAME = re.compile(r"^[^\s+]+$")  # non-empty, no whitespace, no '+'
_MAX_SIGNATURES = 100
_U64 = struct.Struct(">Q")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise CheckpointFormatError(f"{what} is not valid base64: {e}") from e


@dataclass(frozen=True)
class NoteKey:
    """A C2SP verifier key: a name, a signature type and an Ed25519 public key."""

    name: str
    type: bytes  # NOTE_ED25519 or NOTE_COSIGNATURE_V1
    public_key: bytes

    @property
    def key_id(self) -> bytes:
        return note_key_id(self.name, self.type, self.public_key)

    def text(self) -> str:
        material = base64.b64encode(self.type + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{material}"

    @classmethod
    def of(cls, name: str, signing_key: SigningKey, type_: bytes = NOTE_ED25519) -> NoteKey:
        return cls.make(name, type_, bytes(signing_key.verify_key))

    @classmethod
    def make(cls, name: str, type_: bytes, public_key: bytes) -> NoteKey:
        if not _NAME.fullmatch(name) or not name.isprintable():
            raise CheckpointFormatError(
                f"key name {name!r} must be non-empty, printable, without spaces or '+'"
            )
        if type_ not in (NOTE_ED25519, NOTE_COSIGNATURE_V1) or len(public_key) != 32:
            raise CheckpointFormatError("only Ed25519 note and cosignature/v1 keys are supported")
        return cls(name=name, type=type_, public_key=public_key)

    @classmethod
    def parse(cls, text: str) -> NoteKey:
        """``name+hexid+base64(type ‖ key)``; the id must match the key."""
        name, _, rest = text.strip().partition("+")
        key_id, _, material = rest.partition("+")
        raw = _b64decode(material, "the verifier key")
        if len(raw) != 33 or not re.fullmatch(r"[0-9a-f]{8}", key_id):
            raise CheckpointFormatError(
                f"{text.strip()!r} is not a verifier key (name+8 hex digits+base64 of "
                "a type byte and a 32-byte Ed25519 key)"
            )
        key = cls.make(name, raw[:1], raw[1:])
        if key.key_id.hex() != key_id:
            raise CheckpointFormatError(f"verifier key {name}: its id does not match its key")
        return key

    @classmethod
    def given(cls, text: str, what: str = "--journal-key") -> NoteKey:
        """:meth:`parse` of a key the caller gave: a malformed one is
        :class:`VerifierKeyError` (bad input), not a tampered history."""
        try:
            return cls.parse(text)
        except CheckpointFormatError as e:
            raise VerifierKeyError(f"{what}: {e}") from e


@dataclass(frozen=True)
class Signature:
    """One signature line of a note."""

    name: str
    key_id: bytes
    signature: bytes

    def line(self) -> str:
        return f"{_DASH}{self.name} {base64.b64encode(self.key_id + self.signature).decode()}\n"


@dataclass(frozen=True)
class SignedNote:
    """A note's text and its signature lines, exactly as written."""

    text: str
    signatures: tuple[Signature, ...]

    def render(self) -> str:
        return self.text + "\n" + "".join(s.line() for s in self.signatures)

    @classmethod
    def parse(cls, note: str | bytes) -> SignedNote:
        if isinstance(note, bytes):
            try:
                note = note.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CheckpointFormatError(f"a signed note is UTF-8: {e}") from e
        if any(c < " " and c != "\n" for c in note):
            raise CheckpointFormatError("a signed note has no control characters but newlines")
        text, sep, sigs = note.rpartition("\n\n")
        if not sep or not text or not sigs.endswith("\n"):
            raise CheckpointFormatError(
                "not a signed note: the text, a blank line, then signature lines, each "
                "ending in a newline"
            )
        text += "\n"
        lines = sigs[:-1].split("\n")
        if len(lines) > _MAX_SIGNATURES:
            raise CheckpointFormatError(f"more than {_MAX_SIGNATURES} signatures")
        parsed = []
        for line in lines:
            name, _, blob = line.removeprefix(_DASH).partition(" ")
            raw = _b64decode(blob, f"signature of {name!r}")
            if not line.startswith(_DASH) or not _NAME.fullmatch(name) or len(raw) < 5:
                raise CheckpointFormatError(f"malformed signature line {line!r}")
            parsed.append(Signature(name=name, key_id=raw[:4], signature=raw[4:]))
        return cls(text=text, signatures=tuple(parsed))

    def matching(self, key: NoteKey) -> list[Signature]:
        return [s for s in self.signatures if s.name == key.name and s.key_id == key.key_id]

    def add(self, key: NoteKey, signature: bytes) -> SignedNote:
        """This note with one more signature (replacing any earlier one by ``key``)."""
        kept = tuple(s for s in self.signatures if (s.name, s.key_id) != (key.name, key.key_id))
        line = Signature(name=key.name, key_id=key.key_id, signature=signature)
        return replace(self, signatures=(*kept, line))


@dataclass(frozen=True)
class Checkpoint:
    """A C2SP tlog checkpoint: origin, tree size, root hash, extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        root = base64.b64encode(self.root).decode()
        return "".join(f"{line}\n" for line in (self.origin, self.size, root, *self.extensions))

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
            raise CheckpointFormatError(
                "a checkpoint is an origin line, a size line and a root line (then "
                "optional extension lines), each non-empty and ending in a newline"
            )
        origin, size, root, *extensions = lines[:-1]
        if not re.fullmatch(r"0|[1-9][0-9]{0,19}", size) or int(size) >= 2**64:
            raise CheckpointFormatError(f"checkpoint size {size!r} is not a decimal u64")
        digest = _b64decode(root, "the checkpoint root hash")
        if len(digest) != HASH_SIZE:
            raise CheckpointFormatError(f"the checkpoint root hash has {len(digest)} bytes")
        return cls(origin=origin, size=int(size), root=digest, extensions=tuple(extensions))


def sign_checkpoint(checkpoint: Checkpoint, name: str, key: SigningKey) -> SignedNote:
    """The checkpoint as a note signed by ``key`` under ``name`` (signed-note, 0x01)."""
    text = checkpoint.text()
    note_key = NoteKey.of(name, key)
    return SignedNote(text=text, signatures=()).add(note_key, key.sign(text.encode()).signature)


def verify_checkpoint(note: SignedNote, key: NoteKey) -> Checkpoint:
    """The checkpoint of ``note`` if ``key`` signed it; else :class:`NoteSignatureError`."""
    if key.type != NOTE_ED25519:
        raise NoteSignatureError(f"{key.name}: not a note-signing key")
    _verify_one(note, key, lambda s: (note.text.encode(), s.signature))
    checkpoint = Checkpoint.parse(note.text)
    if checkpoint.origin != key.name:
        raise NoteSignatureError(
            f"the checkpoint's origin {checkpoint.origin!r} is not the log {key.name!r}"
        )
    return checkpoint


def _verify_one(
    note: SignedNote, key: NoteKey, split: Callable[[Signature], tuple[bytes, bytes]]
) -> None:
    """Every signature line by ``key`` must verify, and there must be one."""
    found = note.matching(key)
    if not found:
        raise NoteSignatureError(
            f"the note carries no signature by {key.name} (key id {key.key_id.hex()})"
        )
    verify = VerifyKey(key.public_key)
    for sig in found:
        signed, raw = split(sig)
        try:
            verify.verify(signed, raw)
        except (BadSignatureError, ValueError) as e:
            raise NoteSignatureError(
                f"the signature by {key.name} does not verify: the note was altered or "
                "signed by another key"
            ) from e


def cosign(note: SignedNote, key: SigningKey, name: str, timestamp: int) -> SignedNote:
    """Add a C2SP tlog-cosignature/v1 by a witness (the caller checked consistency)."""
    witness = NoteKey.of(name, key, NOTE_COSIGNATURE_V1)
    if not 0 <= timestamp < 2**63:
        raise CheckpointFormatError(f"cosignature time {timestamp} out of range")
    signed = cosignature_message(timestamp, note.text.encode())
    return note.add(witness, _U64.pack(timestamp) + key.sign(signed).signature)


def verify_cosignature(note: SignedNote, key: NoteKey) -> int:
    """The time of a valid cosignature by ``key`` on ``note``; else NoteSignatureError."""
    if key.type != NOTE_COSIGNATURE_V1:
        raise NoteSignatureError(f"{key.name}: not a cosignature/v1 key")

    def split(sig: Signature) -> tuple[bytes, bytes]:
        if len(sig.signature) != 8 + 64:
            raise NoteSignatureError(f"the cosignature by {key.name} is not 72 bytes")
        (timestamp,) = _U64.unpack(sig.signature[:8])
        return cosignature_message(timestamp, note.text.encode()), sig.signature[8:]

    _verify_one(note, key, split)
    (timestamp,) = _U64.unpack(note.matching(key)[0].signature[:8])
    return int(timestamp)
