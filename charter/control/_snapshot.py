"""The views as snapshot bytes, and back: data only (JSON), never pickle.

The encoding is structural over an allow-list: containers, ints, text, and the few
classes the views are made of, each rebuilt with exactly the attributes, in the order,
that this code's class has (checked once per snapshot, or it is refused). Nothing in a
snapshot names code to run. Its version is a digest of the source of every module whose
code shapes the folded state, so a snapshot written by other code is never read (the
views fold from zero instead). Budgets are stored once each and shared (they are frozen).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import sys
from collections import deque
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

import orjson

from charter.authority import SealedGrant
from charter.budgets import Cells, CellState, LeaseBook, LedgerState, ResourceClass
from charter.control.directory import AgentRecord, AuthorityView
from charter.control.placement import Liveness
from charter.control.resources import LivePopulation, ResourceView
from charter.core import Budget, Lineage
from charter.core.budget import budget_of, vec_of
from charter.ledger import JournalFold, cyclic_gc_paused

__all__ = ["FORMAT", "SnapshotRefusedError", "decode", "encode", "version"]

FORMAT = 5  # 5: the lease book's holds of tokens (LedgerState.holds, held)

# Classes rebuilt from their attributes, and the folds themselves (filled in place).
_OBJECTS: dict[str, type] = {
    cls.__name__: cls
    for cls in (LedgerState, CellState, AgentRecord, LeaseBook, Cells, LivePopulation)
}
_ENUMS: dict[str, type[Enum]] = {"ResourceClass": ResourceClass}
_FOLDS = (AuthorityView, ResourceView, Liveness)
_RAW = (int, str, bool, type(None))  # stored as themselves (exact types only)
_RAW_TYPES = frozenset(_RAW)


class SnapshotRefusedError(ValueError):
    """A snapshot's body is not one this code wrote (internal: the caller ignores the
    snapshot and folds from zero; never shown to a user)."""


@functools.cache
def version() -> bytes:
    """The snapshot version: the format and the source of the code that folds (read
    once: the code this process runs is the code it imported)."""
    digest = hashlib.sha256(f"charter/views/{FORMAT}".encode())
    classes = (*_OBJECTS.values(), *_ENUMS.values(), *_FOLDS, Budget, Lineage, SealedGrant)
    modules = sorted({c.__module__ for c in classes} | {JournalFold.__module__, __name__})
    for name in modules:
        source = sys.modules[name].__file__
        try:
            code = Path(source).read_bytes() if source else None
        except OSError:
            code = None
        if code is None:  # the code cannot be told apart from another's: never match
            return b"unknown code " + os.urandom(16)
        digest.update(name.encode() + b"\0" + code)
    return digest.digest()


def _names(cls: type) -> list[str]:
    """A fresh instance's attribute names, in order."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(vars(cls()))


def _layout() -> dict[str, list[str]]:
    return {name: _names(cls) for name, cls in (*_OBJECTS.items(), *_by_name(_FOLDS))}


def _by_name(classes: tuple[type, ...]) -> list[tuple[str, type]]:
    return [(cls.__name__, cls) for cls in classes]


def encode(folds: tuple[AuthorityView, ResourceView, Liveness]) -> bytes:
    """The folds' whole state (both at the same position) as bytes."""
    encoder = _Encoder()
    with cyclic_gc_paused():
        states = [encoder.attributes(fold) for fold in folds]
        return orjson.dumps([_layout(), encoder.budgets, states])


def decode(body: bytes, folds: tuple[AuthorityView, ResourceView, Liveness]) -> None:
    """Give ``folds`` the state in ``body`` (all of it, or none: SnapshotRefusedError)."""
    try:
        with cyclic_gc_paused():
            layout, budgets, states = orjson.loads(body)
            if layout != _layout() or len(states) != len(folds):
                raise SnapshotRefusedError("a snapshot of other views")
            decoder = _Decoder([budget_of(_vec(v)) for v in budgets])
            decoded = [
                dict(zip(layout[type(fold).__name__], decoder.values(state), strict=True))
                for fold, state in zip(folds, states, strict=True)
            ]
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise SnapshotRefusedError(f"snapshot body refused: {e}") from e
    for fold, state in zip(folds, decoded, strict=True):
        fold.__dict__.update(state)


class _Encoder:
    def __init__(self) -> None:
        self.budgets: list[tuple[int, ...]] = []
        self._index: dict[tuple[int, ...], int] = {}

    def attributes(self, obj: object) -> list[Any]:
        return [self.value(v) for v in vars(obj).values()]

    def budget(self, value: Budget) -> int:
        vec = vec_of(value)
        index = self._index.get(vec)
        if index is None:
            index = self._index[vec] = len(self.budgets)
            self.budgets.append(vec)
        return index

    def column(self, values: list[Any]) -> Any:
        if values and all(type(v) is Budget for v in values):
            return ["lB", *map(self.budget, values)]
        return self.value(values)

    def table(self, value: dict[Any, Any]) -> list[Any] | None:
        """A mapping to objects of one allow-listed class, by column (one entry per
        attribute, not per object): None if it is not one."""
        first = next(iter(value.values()), None)
        kind = type(first)
        if _OBJECTS.get(kind.__name__) is not kind or len(value) < 2:
            return None
        if not all(type(v) is kind for v in value.values()):
            return None
        rows = [list(vars(v).values()) for v in value.values()]
        columns = [self.column(list(c)) for c in zip(*rows, strict=True)]
        return ["D", kind.__name__, self.value(list(value)), *columns]

    def value(self, value: Any) -> Any:  # noqa: PLR0911, PLR0912 (a branch per type)
        kind = type(value)
        if kind in _RAW:
            return value
        if kind is Budget:
            return ["B", self.budget(value)]
        if kind is dict:
            table = self.table(value)
            if table is not None:
                return table
            keys = "L" if all(type(k) is Lineage for k in value) else ""
            if keys or all(type(k) in _RAW for k in value):
                if all(type(v) in _RAW for v in value.values()):
                    return [f"d{keys}0", *(x for kv in value.items() for x in kv)]
                return [f"d{keys}", *(x for k, v in value.items() for x in (k, self.value(v)))]
            return ["d", *(x for k, v in value.items() for x in (self.value(k), self.value(v)))]
        tag = _SEQUENCES.get(kind)
        if tag is not None:
            if all(type(x) in _RAW for x in value):
                return [f"{tag}0", *value]
            return [tag, *map(self.value, value)]
        if kind is Lineage:
            return ["L", str(value)]
        if kind is bytes:
            return ["b", value.hex()]
        if kind is SealedGrant:
            return ["G", value.body.hex(), value.signature.hex()]
        if _ENUMS.get(kind.__name__) is kind:
            return ["e", kind.__name__, value.value]
        if _OBJECTS.get(kind.__name__) is kind:
            return ["o", kind.__name__, *self.attributes(value)]
        raise SnapshotRefusedError(f"cannot snapshot a {kind.__name__}")


_SEQUENCES: dict[type, str] = {tuple: "t", list: "l", set: "s", frozenset: "f", deque: "q"}


class _Decoder:
    def __init__(self, budgets: list[Budget]) -> None:
        self.budgets = budgets
        self.layout = _layout()
        value = self.value
        sequences: dict[str, Callable[[list[Any]], Any]] = {
            "t": tuple,
            "l": list,
            "s": set,
            "f": frozenset,
            "q": deque,
        }
        self.tags: dict[str, Callable[[list[Any]], Any]] = {}
        for tag, make in sequences.items():
            self.tags[f"{tag}0"] = lambda xs, make=make: make(_raw(xs))  # type: ignore[misc]
            self.tags[tag] = lambda xs, make=make: make(map(value, xs))  # type: ignore[misc]
        self.tags |= {
            "d0": lambda xs: _pairs(_raw(xs)),
            "dL0": lambda xs: _pairs(_lineage_keys(_raw(xs))),
            "dL": lambda xs: _pairs(_lineage_keys([value(x) for x in xs])),
            "d": lambda xs: _pairs([value(x) for x in xs]),
            "B": lambda xs: self.budgets[xs[0]],
            "lB": lambda xs: [self.budgets[i] for i in xs],
            "D": self.table,
            "L": lambda xs: _lineage(xs[0]),
            "b": lambda xs: bytes.fromhex(xs[0]),
            "G": lambda xs: SealedGrant(body=bytes.fromhex(xs[0]), signature=bytes.fromhex(xs[1])),
            "e": lambda xs: _ENUMS[xs[0]](xs[1]),
            "o": self.object,
        }

    def value(self, value: Any) -> Any:
        if type(value) is list:
            return self.tags[value[0]](value[1:])
        if type(value) in _RAW:
            return value
        raise SnapshotRefusedError(f"a {type(value).__name__} in a snapshot")

    def values(self, values: list[Any]) -> list[Any]:
        return [self.value(v) for v in values]

    def table(self, xs: list[Any]) -> dict[Any, object]:
        cls, names = _OBJECTS[xs[0]], self.layout[xs[0]]
        keys = self.value(xs[1])
        columns = [self.value(c) for c in xs[2:]]
        if len(columns) != len(names) or any(len(c) != len(keys) for c in columns):
            raise SnapshotRefusedError(f"a table of {xs[0]} with other columns")
        out: dict[Any, object] = {}
        new = object.__new__
        for key, *row in zip(keys, *columns, strict=True):
            obj: object = new(cls)
            obj.__dict__.update(zip(names, row, strict=True))
            out[key] = obj
        return out

    def object(self, xs: list[Any]) -> object:
        cls = _OBJECTS[xs[0]]
        obj: object = object.__new__(cls)
        obj.__dict__.update(zip(self.layout[xs[0]], self.values(xs[1:]), strict=True))
        return obj


def _raw(xs: list[Any]) -> list[Any]:
    if not all(map(_RAW_TYPES.__contains__, map(type, xs))):
        raise SnapshotRefusedError("a container where a plain value belongs")
    return xs


def _lineage(text: Any) -> Lineage:
    if type(text) is not str:
        raise SnapshotRefusedError("a lineage that is not text")
    # Not re-validated (the views only ever held valid lineages, and the snapshot's
    # version, journal and chain hash were checked): building each is the cost saved.
    return str.__new__(Lineage, text)


def _lineage_keys(flat: list[Any]) -> list[Any]:
    flat[::2] = [_lineage(k) for k in flat[::2]]
    return flat


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    if len(flat) % 2:
        raise SnapshotRefusedError("a mapping with a key and no value")
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _vec(values: Any) -> tuple[int, int, int, int, int]:
    if len(values) != 5 or not all(type(x) is int and x >= 0 for x in values):
        raise SnapshotRefusedError("a budget that is not five counts >= 0")
    return tuple(values)
