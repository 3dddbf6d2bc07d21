"""Plain records shared by the journal adapters (no driver imports here)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple
from uuid import UUID

from eventsourcing.persistence import IntegrityError
from pydantic import BaseModel, ConfigDict, ValidationError

from charter.core.errors import StateError
from charter.core.framing import ChainRow

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "Guards",
    "check_guards",
    "ChainRow",
    "JournalMeta",
    "LastCommit",
    "PinnedStreamMovedError",
    "last_commit",
    "set_last_commit",
]

FORMAT = "charter-journal"
SCHEMA_VERSION = 1


class LastCommit(NamedTuple):
    """Positions and hashes assigned by the recorder in the last committed insert."""

    positions: tuple[int, ...]
    hashes: tuple[bytes, ...]


class PinnedStreamMovedError(IntegrityError):
    """Raised by a recorder, under its write lock, when a pinned stream that the batch
    does not write to is no longer at the version the caller decided on."""


# A guard: (originator id, the version the caller's decision read).
Guards = tuple[tuple[UUID, int], ...]


def check_guards(guards: Guards, version: Callable[[UUID], int]) -> None:
    """Under the write lock: every guarded stream is still at its decided version."""
    for originator, expected in guards:
        if version(originator) != expected:
            raise PinnedStreamMovedError(
                f"stream {originator} moved past version {expected} after the decision"
            )


# What the recorder of this thread committed last: the Journal reads it after the
# library's save() returns (save() does not return the chain's hashes).
_last = threading.local()


def set_last_commit(value: LastCommit | None) -> None:
    _last.value = value


def last_commit() -> LastCommit | None:
    value: LastCommit | None = getattr(_last, "value", None)
    return value


class JournalMeta(BaseModel):
    """Write-once facts about a journal, stored beside its events."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = FORMAT
    schema_version: int = SCHEMA_VERSION
    created_at: str
    journal_key: str  # hex Ed25519 public key that signs this journal's checkpoints

    def to_rows(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.model_dump().items()}

    @classmethod
    def from_rows(cls, rows: dict[str, str], *, where: str) -> JournalMeta:
        try:
            meta = cls.model_validate(rows)
        except ValidationError as e:
            raise StateError(f"{where} is not a Charter journal (bad metadata: {e})") from None
        if meta.format != FORMAT:
            raise StateError(f"{where} is not a Charter journal (format {meta.format!r})")
        if meta.schema_version != SCHEMA_VERSION:
            raise StateError(
                f"{where} has journal schema v{meta.schema_version}; this Charter reads "
                f"v{SCHEMA_VERSION}"
            )
        return meta
