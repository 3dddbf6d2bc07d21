"""Errors of the sandbox package, grouped by fault (see charter/ledger/errors.py)."""

from __future__ import annotations

from charter.ledger.errors import BadInputError, RefusedError, StateError, UnavailableError

__all__ = [
    "SandboxBudgetError",
    "HostCannotIsolateError",
    "PoolExhaustedError",
    "SlotStateError",
    "SandboxUnavailableError",
    "UidPoolExhaustedError",
    "KeyHandleError",
]


class SandboxBudgetError(BadInputError):
    """The budget cannot be turned into a runnable sandbox (for example a zero wall clock)."""


class HostCannotIsolateError(RefusedError):
    """The host cannot provide every isolation property; spawning is refused (exit 4)."""


class PoolExhaustedError(RefusedError):
    """Every warm-pool slot is leased: the cell's sandbox admission cap is reached."""


class SlotStateError(StateError):
    """A slot was used out of order (run twice, run after release, released twice)."""


class SandboxUnavailableError(UnavailableError):
    """A host facility the launcher needs (bwrap, cgroups, a mount) failed while in use."""


class UidPoolExhaustedError(RefusedError):
    """Every unprivileged host uid of the sandbox range is held by a live sandbox."""


class KeyHandleError(RefusedError):
    """A key handle is unknown, released, or presented by a sandbox it was not issued to."""
