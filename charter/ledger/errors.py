"""Errors of the storage engine, over the fault groups in :mod:`charter.core.errors`."""

from __future__ import annotations

from charter.core.errors import BadInputError, StateError, UnavailableError

__all__ = [
    "AlreadyTrackedError",
    "AppendConflictError",
    "AppendFailedError",
    "BatchCommittedError",
    "DeadlinePassedError",
    "HeadPinLostError",
    "OutcomeUnknownError",
    "UndecodableEntryError",
    "UnknownSchemeError",
    "WriterStalledError",
]


class AppendFailedError(UnavailableError):
    """A journal append did not commit; nothing of the batch was written."""


class AppendConflictError(StateError):
    """Another writer appended to a stream since the version the caller decided on."""


class HeadPinLostError(AppendConflictError):
    """The append was pinned to the journal's head as the decision read it
    (``expect_head``), and something committed since; or it would have committed before
    the time the decision took as settled (``not_before_ms``). Nothing was written:
    decide again on the state now."""


class AlreadyTrackedError(StateError):
    """A follower tried to record a position it (or another copy of it) already did."""


class DeadlinePassedError(StateError):
    """The batch would have committed at or after a deadline its decision relied on
    (a lease's end): nothing was written. Decide again on the state as it is now."""


class UndecodableEntryError(StateError):
    """A stored entry's bytes do not decode as the event type they name."""


class UnknownSchemeError(BadInputError):
    """A journal URL whose scheme Charter does not speak."""


class OutcomeUnknownError(UnavailableError):
    """The connection was lost while a batch was committing, and whether it committed
    could not be settled within the bounded wait. Never treat it as "nothing written":
    look the batch up by :attr:`batch` (``charter journal show --batch ID``) before
    retrying, or retry with the same batch id, which never writes it twice."""

    def __init__(self, message: str, *, batch: str) -> None:
        super().__init__(message)
        self.batch = batch


class BatchCommittedError(StateError):
    """A request whose batch id is already in the journal: it committed earlier (maybe
    under an outcome-unknown error) and is not done again."""

    def __init__(self, message: str, *, batch: str, positions: tuple[int, int]) -> None:
        super().__init__(message)
        self.batch = batch
        self.positions = positions


class WriterStalledError(AppendFailedError):
    """Another writer held the journal's write lock (or a journal statement ran) past
    the configured timeout: nothing of this batch was written. Retry once the stalled
    writer is gone; the timeouts are CHARTER_PG_LOCK_TIMEOUT and
    CHARTER_PG_STATEMENT_TIMEOUT on PostgreSQL (30 s busy timeout on SQLite)."""
