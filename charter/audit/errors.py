"""Errors of the auditor's side, over the fault groups in :mod:`charter.core.errors`."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from charter.core.errors import BadInputError, TamperedError

__all__ = [
    "BundleError",
    "ChainBrokenError",
    "CheckpointFormatError",
    "ConsistencyProofError",
    "InclusionProofError",
    "KeyHistoryFormatError",
    "KeyRotationError",
    "NoteSignatureError",
    "NotInTreeError",
    "TreeAheadError",
    "TreeFollowError",
    "VerifierKeyError",
    "WitnessForkError",
    "WitnessRollbackError",
]


class _Finding(Protocol):
    """What a failed report says (``ChainReport`` fits)."""

    @property
    def first_bad_position(self) -> int | None: ...
    @property
    def reason(self) -> str | None: ...


R = TypeVar("R", bound=_Finding)


class ChainBrokenError(TamperedError, Generic[R]):
    """The journal does not verify; ``report`` says where and why."""

    def __init__(self, report: R) -> None:
        super().__init__(
            f"journal does not verify at position {report.first_bad_position}: {report.reason}"
        )
        self.report = report


class InclusionProofError(TamperedError):
    """An inclusion proof does not show its entry in the tree of its checkpoint."""


class ConsistencyProofError(TamperedError):
    """A tree is not a consistent extension of an earlier one (cut, fork, rewrite)."""


class NoteSignatureError(TamperedError):
    """A signed note (checkpoint) lacks a valid signature by the expected key."""


class CheckpointFormatError(TamperedError):
    """Text that should be a signed note, checkpoint or verifier key is malformed."""


class TreeFollowError(TamperedError):
    """The journal's entries do not chain where the Merkle follower reads them, so no
    tree (and no checkpoint) is built over them."""


class VerifierKeyError(BadInputError):
    """A verifier key the caller gave (``--journal-key``, ``--log-key``, …) is not one:
    bad input (exit 2), never "the journal does not verify"."""


class TreeAheadError(TamperedError):
    """The stored Merkle tree has a leaf the journal no longer holds (its tail was cut,
    or its last entry changed): no checkpoint or proof is signed over it."""


class KeyHistoryFormatError(BadInputError):
    """A key-history document (``--key-history FILE``) that does not parse."""


class NotInTreeError(BadInputError):
    """A position or tree size the Merkle tree does not (yet) have."""


class WitnessForkError(TamperedError):
    """A witness refuses a checkpoint that does not extend the one it cosigned last."""


class WitnessRollbackError(TamperedError):
    """A witness refuses a checkpoint smaller than the one it cosigned last."""


class BundleError(TamperedError):
    """An export bundle does not verify; ``part`` names the first part that does not."""

    def __init__(self, part: str, why: str) -> None:
        super().__init__(f"bundle part {part} does not verify: {why}")
        self.part = part


class KeyRotationError(TamperedError):
    """A journal key rotation that is not signed by both the current and the new key."""
