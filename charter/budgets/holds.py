"""Tokens of a lease held for calls that will charge them: the lease book's view of a hold.

A layer above (the model door's blocks, docs/model-door.md) journals its holds as its
own events; the lease book folds them through these abstract bases, so it names none of
that layer's code. A hold counts against its lease's remainder (what a spawn may carve,
what another hold may take) from its commit until its release, less what the calls
settled on it charged (their ``UsageRecorded`` is the lease's spend): exact, so a
settled call is never counted twice.
"""

from __future__ import annotations

from charter.core.events import Event

__all__ = ["HOLD_TYPES", "HeldTokensCharged", "HeldTokensReleased", "TokensHeld"]

HOLD_TYPES = ("ModelTokensHeld", "ModelCallSettled", "ModelTokensReleased")
"""The stored type names of the events that subclass the bases below (a fold reads
entries by name: tests/budgets/test_holds.py checks these are exactly the subclasses)."""


class TokensHeld(Event):
    """A hold of a lease's tokens (abstract)."""

    def hold(self) -> tuple[str, str, int]:
        """``(hold, lineage, tokens)``: the hold's key, its lease and what it holds."""
        raise NotImplementedError


class HeldTokensCharged(Event):
    """A call settled on a hold, charged in its append (abstract)."""

    def charged_from(self) -> tuple[str, str, int] | None:
        """``(hold, lineage, tokens)``: the hold it drew from, its lease and the tokens
        its usage charges; None if it drew from no hold."""
        raise NotImplementedError


class HeldTokensReleased(Event):
    """A hold's end (abstract)."""

    def released_hold(self) -> tuple[str, str]:
        """``(hold, lineage)``."""
        raise NotImplementedError
