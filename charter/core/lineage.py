"""Lineage paths: ``agent:<root>/sa-<id>/sa-<id>``.

A worker is named by its path. Its parent is the path minus its last segment and its
ancestors are the prefixes of the path, so the tree is derived from the names alone:
there is no edge store anywhere.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from charter.core.errors import LineageError

__all__ = ["Lineage", "MAX_LINEAGE_CHARS", "MAX_LINEAGE_DEPTH"]

MAX_LINEAGE_CHARS = 512
MAX_LINEAGE_DEPTH = 32
_SCHEME = "agent:"
# Explicit ASCII classes: \w and \d would admit Unicode look-alikes.
_ROOT = re.compile(r"[a-z][a-z0-9-]{0,62}")
_WORKER = re.compile(r"sa-[0-9a-z]{1,32}")


class Lineage(str):
    """A validated lineage path. A ``str`` subclass, so it serialises as itself."""

    __slots__ = ()

    def __new__(cls, text: object) -> Lineage:
        if isinstance(text, Lineage):
            return text
        if not isinstance(text, str):
            raise LineageError(f"a lineage is text like 'agent:root/sa-1', not {type(text)}")
        _check(text)
        return super().__new__(cls, text)

    @classmethod
    def root(cls, name: str) -> Lineage:
        """The lineage of the durable root agent ``name``."""
        return cls(_SCHEME + name)

    @property
    def segments(self) -> tuple[str, ...]:
        """The root name, then each worker segment."""
        return tuple(self[len(_SCHEME) :].split("/"))

    @property
    def root_name(self) -> str:
        return self.segments[0]

    @property
    def root_lineage(self) -> Lineage:
        return Lineage.root(self.root_name)

    @property
    def depth(self) -> int:
        """0 for a root, 1 for its children, and so on."""
        return self.count("/")

    @property
    def is_root(self) -> bool:
        return "/" not in self

    @property
    def parent(self) -> Lineage | None:
        """The path minus its last segment; ``None`` for a root."""
        cut = self.rfind("/")
        return None if cut < 0 else _trusted(self[:cut])

    def child(self, worker_id: str) -> Lineage:
        """The lineage of this agent's child ``sa-<worker_id>``.

        Only the new segment and the limits are checked: this path is valid already.
        """
        segment = f"sa-{worker_id}"
        text = f"{self}/{segment}"
        if (
            not _WORKER.fullmatch(segment)
            or len(text) > MAX_LINEAGE_CHARS
            or self.depth + 1 > MAX_LINEAGE_DEPTH
        ):
            return Lineage(text)  # raises the full, specific error
        return _trusted(text)

    def ancestors(self) -> tuple[Lineage, ...]:
        """Every proper ancestor, nearest first, ending at the root."""
        out: list[Lineage] = []
        node = self.parent
        while node is not None:
            out.append(node)
            node = node.parent
        return tuple(out)

    def is_ancestor_of(self, other: Lineage) -> bool:
        """True when ``other`` lies strictly below this path (segment-wise prefix)."""
        return len(other) > len(self) and other.startswith(self) and other[len(self)] == "/"

    def is_within(self, other: Lineage) -> bool:
        """True when this path is ``other`` or lies below it."""
        return self == other or other.is_ancestor_of(self)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        del source, handler
        return core_schema.no_info_plain_validator_function(
            cls._validate,
            json_schema_input_schema=core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )

    @classmethod
    def _validate(cls, value: object) -> Lineage:
        try:
            return cls(value)
        except LineageError as e:
            # pydantic turns ValueError into a validation error with our message.
            raise ValueError(str(e)) from e


def _trusted(text: str) -> Lineage:
    """A prefix of a valid lineage cut at '/', which is valid by construction."""
    return str.__new__(Lineage, text)


def _check(text: str) -> None:
    shown = repr(text[:80]) + ("…" if len(text) > 80 else "")
    if not text:
        raise LineageError("a lineage may not be empty; write it as agent:<root>/sa-<id>/…")
    if len(text) > MAX_LINEAGE_CHARS:
        raise LineageError(
            f"lineage {shown} is {len(text)} characters long; at most {MAX_LINEAGE_CHARS}"
        )
    if not text.startswith(_SCHEME):
        raise LineageError(f"lineage {shown} must start with 'agent:' (agent:<root>/sa-<id>)")
    segments = text[len(_SCHEME) :].split("/")
    if len(segments) - 1 > MAX_LINEAGE_DEPTH:
        raise LineageError(
            f"lineage {shown} is {len(segments) - 1} levels deep; at most {MAX_LINEAGE_DEPTH}"
        )
    root, workers = segments[0], segments[1:]
    if not _ROOT.fullmatch(root):
        raise LineageError(
            f"lineage {shown}: root name {root[:64]!r} must be 1-63 lower-case letters, "
            "digits or '-', starting with a letter"
        )
    for segment in workers:
        if segment in {"", ".", ".."}:
            raise LineageError(
                f"lineage {shown}: empty, '.' or '..' segments are not allowed (no path "
                "traversal); each worker segment is sa-<id>"
            )
        if not _WORKER.fullmatch(segment):
            raise LineageError(
                f"lineage {shown}: segment {segment[:40]!r} must be 'sa-' followed by 1-32 "
                "lower-case letters or digits"
            )
