"""Errors of the supervision package, over the fault groups in :mod:`charter.core.errors`."""

from __future__ import annotations

from charter.core.errors import BadInputError

__all__ = ["BaselineClassError", "CanaryMismatchError", "CanaryNonceError"]


class BaselineClassError(BadInputError):
    """A worker's profile was offered to the baseline of another task class."""


class CanaryMismatchError(BadInputError):
    """A canary touch was reported against the canaries of another sandbox."""


class CanaryNonceError(BadInputError):
    """A sandbox's canaries were asked for with a nonce of fewer than 16 bytes."""
