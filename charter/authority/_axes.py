"""The axes of a grant and, for each one, what "narrower" means and how two values meet.

Every axis is spelled out here on purpose: a generic set or JSON intersection gets the
ordered axes (clearance, permission mode) and the pattern axis (egress) wrong.

| axis       | value                         | child within parent when …          | meet     |
|------------|-------------------------------|-------------------------------------|----------|
| tools      | frozenset of tool names       | subset                              | ∩        |
| egress     | exact hosts, ``*.domain``     | every entry covered by a parent one | pairwise |
| secrets    | frozenset of secret names     | subset                              | ∩        |
| clearance  | public < internal < … secret  | rank ≤                              | min      |
| mode       | plan < default < … bypass     | rank ≤ (no more permissive)         | min      |
| depth      | levels it may still spawn     | strictly less (checked at mint)     | min      |
| fanout     | children it may still spawn   | strictly less than what remains     | min      |
| budget     | five-axis ceiling             | every axis ≤                        | min      |
| expiry     | unix milliseconds             | ≤ (expires no later)                | min      |
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated

from charter.core.destination import Destination, axis_validator, check_destination, covers
from charter.core.errors import AxisValueError
from charter.core.secrets import SecretName, check_secret  # one rule: the grant, the store

__all__ = [
    "Clearance",
    "PermissionMode",
    "ToolName",
    "SecretName",
    "Destination",
    "check_tool",
    "check_secret",
    "check_destination",
    "covers",
    "set_within",
    "set_meet",
    "egress_within",
    "egress_meet",
    "minimal",
]


class Clearance(StrEnum):
    """Ordered data-clearance levels, lowest first. A child's clearance never rises."""

    PUBLIC = "public"
    INTERNAL = "internal"
    CONFIDENTIAL = "confidential"
    SECRET = "secret"  # noqa: S105 - a level's name, not a password

    @property
    def rank(self) -> int:
        return _CLEARANCE_RANK[self]

    def within(self, other: Clearance) -> bool:
        return self.rank <= other.rank

    def meet(self, other: Clearance) -> Clearance:
        return self if self.rank <= other.rank else other


class PermissionMode(StrEnum):
    """Ordered permission modes, least permissive first.

    ``plan`` may only read and propose; ``default`` asks before each side effect;
    ``accept-edits`` may edit its workspace without asking; ``bypass`` asks for nothing.
    A child is never more permissive than its parent (the opposite of harnesses where a
    permissive parent's mode overrides the child's).
    """

    PLAN = "plan"
    DEFAULT = "default"
    ACCEPT_EDITS = "accept-edits"
    BYPASS = "bypass"

    @property
    def rank(self) -> int:
        return _MODE_RANK[self]

    def within(self, other: PermissionMode) -> bool:
        return self.rank <= other.rank

    def meet(self, other: PermissionMode) -> PermissionMode:
        return self if self.rank <= other.rank else other


_CLEARANCE_RANK = {level: i for i, level in enumerate(Clearance)}
_MODE_RANK = {mode: i for i, mode in enumerate(PermissionMode)}

_TOOL = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,127}")


def check_tool(name: str) -> str:
    """A tool name: a letter, then letters, digits, ``_ . : -`` (at most 128)."""
    if not _TOOL.fullmatch(name):
        raise AxisValueError(
            f"tool name {name[:80]!r}: start with a letter, then letters, digits, '_', "
            "'.', ':' or '-' (at most 128 characters)"
        )
    return name


ToolName = Annotated[str, axis_validator(check_tool)]


# Sets (tools, secrets): narrower is subset, meet is intersection.


def set_within(child: frozenset[str], parent: frozenset[str]) -> bool:
    return child <= parent


def set_meet(requested: frozenset[str], parent: frozenset[str]) -> frozenset[str]:
    return requested & parent


# Egress: the destination vocabulary and its ``covers`` are core's (one for the
# grant and the broker); here, how two sets of entries compare and meet.


def egress_within(child: frozenset[str], parent: frozenset[str]) -> bool:
    """Every child entry is covered by some parent entry."""
    return all(any(covers(p, c) for p in parent) for c in child)


def minimal(entries: Iterable[str]) -> frozenset[str]:
    """Drop entries covered by another entry, so each host is admitted by one rule. Of
    two spellings of the same destination (each covers the other: ``10.0.0.7`` and
    ``10.0.0.7/32``) the first by code point stays: dropping both would lose authority."""
    pool = set(entries)

    def dropped(e: str) -> bool:
        return any(o != e and covers(o, e) and (o < e or not covers(e, o)) for o in pool)

    return frozenset(e for e in pool if not dropped(e))


def egress_meet(requested: frozenset[str], parent: frozenset[str]) -> frozenset[str]:
    """The hosts admitted by both: per pair, the narrower entry when one covers the other.

    Two patterns neither of which covers the other admit disjoint host sets (one would
    be a suffix of the other otherwise), as do an exact host and a pattern that does
    not cover it, so such pairs contribute nothing.
    """
    out: list[str] = []
    for r in requested:
        for p in parent:
            if covers(p, r):
                out.append(r)
            elif covers(r, p):
                out.append(p)
    return minimal(out)
