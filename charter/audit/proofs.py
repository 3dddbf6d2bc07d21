"""Proofs as text: C2SP tlog-proof for inclusion, and Charter's consistency-proof text.

Inclusion (``c2sp.org/tlog-proof@v1``)::

    c2sp.org/tlog-proof@v1
    extra <base64 of the entry's frame: its leaf input>
    index <leaf index, decimal>
    <base64 hash>            (the RFC 6962 audit path, leaf's sibling first)
    ...
    <blank line>
    <the signed checkpoint note, verbatim>

Consistency (``charter/consistency-proof@v1``; C2SP defines no text for it)::

    charter/consistency-proof@v1
    old <size>
    new <size>
    <base64 hash>            (RFC 6962 PROOF(old, D[new]), in its order)
    ...

Pure: no journal, no database.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from charter.audit import merkle
from charter.audit.errors import CheckpointFormatError, InclusionProofError
from charter.audit.note import Checkpoint, NoteKey, SignedNote, verify_checkpoint
from charter.core.framing import HASH_SIZE

__all__ = ["ConsistencyText", "InclusionText", "TLOG_PROOF", "CONSISTENCY_PROOF"]

TLOG_PROOF = "c2sp.org/tlog-proof@v1"
CONSISTENCY_PROOF = "charter/consistency-proof@v1"
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,19}")


def _hash(line: str) -> bytes:
    try:
        digest = base64.b64decode(line.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise CheckpointFormatError(f"proof line {line!r} is not base64") from e
    if len(digest) != HASH_SIZE:
        raise CheckpointFormatError(f"proof line {line!r} is not a 32-byte hash")
    return digest


def _number(line: str, word: str) -> int:
    head, _, value = line.partition(" ")
    if head != word or not _DECIMAL.fullmatch(value):
        raise CheckpointFormatError(f"expected `{word} N`, got {line!r}")
    return int(value)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass(frozen=True)
class InclusionText:
    """A tlog-proof: the entry's frame (extra), its index, its path and the checkpoint."""

    frame: bytes
    index: int
    path: tuple[bytes, ...]
    note: SignedNote

    def render(self) -> str:
        lines = [TLOG_PROOF, f"extra {_b64(self.frame)}", f"index {self.index}"]
        lines += [_b64(p) for p in self.path]
        return "\n".join(lines) + "\n\n" + self.note.render()

    @classmethod
    def parse(cls, text: str) -> InclusionText:
        head, sep, note = text.partition("\n\n")
        lines = head.split("\n")
        if not sep or lines[0] != TLOG_PROOF or len(lines) < 3:
            raise CheckpointFormatError(f"not a {TLOG_PROOF} proof")
        extra, _, blob = lines[1].partition(" ")
        if extra != "extra":
            raise CheckpointFormatError("this proof carries no entry (its `extra` line)")
        try:
            frame = base64.b64decode(blob.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as e:
            raise CheckpointFormatError("the proof's `extra` line is not base64") from e
        return cls(
            frame=frame,
            index=_number(lines[2], "index"),
            path=tuple(_hash(line) for line in lines[3:]),
            note=SignedNote.parse(note),
        )

    def verify(self, key: NoteKey) -> Checkpoint:
        """The checkpoint, once its signature and the entry's inclusion verify."""
        checkpoint = verify_checkpoint(self.note, key)
        if self.index >= checkpoint.size:
            raise InclusionProofError(
                f"index {self.index} is not in the checkpoint's {checkpoint.size} entries"
            )
        merkle.verify_inclusion(
            merkle.leaf_hash(self.frame), self.index, checkpoint.size, self.path, checkpoint.root
        )
        return checkpoint


@dataclass(frozen=True)
class ConsistencyText:
    """A consistency proof between two tree sizes."""

    old: int
    new: int
    path: tuple[bytes, ...]

    def render(self) -> str:
        lines = [CONSISTENCY_PROOF, f"old {self.old}", f"new {self.new}"]
        return "\n".join([*lines, *(_b64(p) for p in self.path)]) + "\n"

    @classmethod
    def parse(cls, text: str) -> ConsistencyText:
        lines = text.rstrip("\n").split("\n")
        if len(lines) < 3 or lines[0] != CONSISTENCY_PROOF:
            raise CheckpointFormatError(f"not a {CONSISTENCY_PROOF} proof")
        return cls(
            old=_number(lines[1], "old"),
            new=_number(lines[2], "new"),
            path=tuple(_hash(line) for line in lines[3:]),
        )
