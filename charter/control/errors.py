"""Errors of the command handlers that are not a domain's own, over the fault groups in
:mod:`charter.core.errors`."""

from __future__ import annotations

from charter.core.errors import StateError

__all__ = ["CellSupersededError"]


class CellSupersededError(StateError):
    """This incarnation of a cell is fenced: a newer incarnation took its cell over (its
    ``CellStarted`` moved the cell's run stream past this one's claim), or this one's
    claim lapsed before it could renew it. It stops starting work, kills the sandboxes
    it still holds and ends (whoever takes the cell over fails their workers)."""
