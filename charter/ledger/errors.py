"""Errors of the ledger, grouped by fault. The CLI maps each group to an exit code."""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "CharterError",
    "BadInputError",
    "UnavailableError",
    "StateError",
    "TamperedError",
    "RefusedError",
    "AppendFailedError",
]


class CharterError(Exception):
    """Base of every error Charter raises on purpose; the message says what to do."""


class BadInputError(CharterError):
    """The caller gave something malformed (exit 1 at the CLI, or 2 for usage)."""


class UnavailableError(CharterError):
    """A backend (database, host facility) could not be reached or used."""


class StateError(CharterError):
    """The request does not fit the current state (already initialised, not a journal …)."""


class TamperedError(CharterError):
    """Stored history does not verify (exit 3)."""


class RefusedError(CharterError):
    """Refused by policy: gate, invariant, admission, budget, or an unisolating host (exit 4).

    ``reason`` is a stable code: what the journal records with the refusal.
    """

    reason: ClassVar[str] = "refused"


class AppendFailedError(UnavailableError):
    """A journal append did not commit; nothing of the batch was written."""
