"""Errors of the sandbox package, over the fault groups in :mod:`charter.core.errors`.
Each refusal has its own stable ``reason`` code (journaled with it)."""

from __future__ import annotations

from charter.core.errors import BadInputError, RefusedError, StateError, UnavailableError

__all__ = [
    # bad input
    "SandboxBudgetError",
    "HostFactsError",
    "PoolCapacityError",
    "SignatureTagError",
    "KeySeedError",
    # state
    "SlotStateError",
    # unavailable
    "SandboxUnavailableError",
    # refused
    "HostCannotIsolateError",
    "PoolExhaustedError",
    "UidPoolExhaustedError",
    "KeyHandleError",
    "WorkspaceRefusedError",
]


class SandboxBudgetError(BadInputError):
    """The budget cannot be turned into a runnable sandbox (for example a zero wall clock)."""


class HostFactsError(BadInputError):
    """A host fact given to the spec compiler is malformed (a relative path, an
    architecture with no seccomp table)."""


class PoolCapacityError(BadInputError):
    """A warm pool was asked for with a capacity below one slot."""


class SignatureTagError(BadInputError):
    """A signature tag for the key broker is not of the allowed form."""


class KeySeedError(BadInputError):
    """A custody-key seed handed to the key broker is not a valid Ed25519 seed."""


class SlotStateError(StateError):
    """A slot was used out of order (run twice, run after release, released twice)."""


class SandboxUnavailableError(UnavailableError):
    """A host facility the launcher needs (bwrap, cgroups, a mount) failed while in use."""


class HostCannotIsolateError(RefusedError):
    """The host cannot provide every isolation property; spawning is refused (exit 4)."""

    reason = "host-cannot-isolate"


class PoolExhaustedError(RefusedError):
    """Every warm-pool slot is leased: the cell's sandbox admission cap is reached."""

    reason = "pool-exhausted"


class UidPoolExhaustedError(RefusedError):
    """Every unprivileged host uid of the sandbox range is held by a live sandbox."""

    reason = "uid-pool-exhausted"


class KeyHandleError(RefusedError):
    """A key handle is unknown, released, or presented by a sandbox it was not issued to."""

    reason = "key-handle"


class WorkspaceRefusedError(RefusedError):
    """A ``--workspace`` path is reached through a symlink (or a ``..``), or is not a
    directory: a sandbox could have planted the link to bind a host directory into the
    next one. Give the directory's real path."""

    reason = "workspace-unsafe"
