"""Errors of the projections, over the fault groups of :mod:`charter.core.errors`."""

from __future__ import annotations

from charter.core.errors import BadInputError, StateError

__all__ = ["PositionBeyondHeadError", "ProjectionConflictError"]


class PositionBeyondHeadError(BadInputError):
    """An ``--as-of`` position the journal has not reached."""


class ProjectionConflictError(StateError):
    """The tracking row refused a position (another copy already recorded it)."""
