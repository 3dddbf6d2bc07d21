"""The budget vector: five axes every grant, lease and sandbox is measured in.

Written for people as ``tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB`` and in
JSON as integers (``tokens``, ``wall_ms``, ``cpu_ms``, ``mem_bytes``, ``egress_bytes``).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import ClassVar

from pydantic import ConfigDict, Field

from charter.core._model import CheckedModel
from charter.core.errors import BudgetSyntaxError

__all__ = [
    "INT64_MAX",
    "MAX_TTL_S",
    "Budget",
    "VEC_ZERO",
    "Vec",
    "budget_of",
    "parse_duration_ms",
    "vec_add",
    "vec_min",
    "vec_of",
    "vec_sat_sub",
    "vec_sub",
]


INT64_MAX = 2**63 - 1
"""The largest integer any event or request may carry: what both databases store (a
SQLite INTEGER, a PostgreSQL bigint), so no accepted value can break a projection."""

MAX_TTL_S = 100 * 366 * 86_400
"""The longest lifetime a grant may ask for (a century): now + ttl stays in range."""

# ASCII digits only (\d would take any script's digits, and 𝟗 would be charged as 9);
# at most 24 digits before any unit, so no quantity is bigger than it looks.
_NUMBER = re.compile(r"\s*([0-9]{1,24}(?:\.[0-9]{1,9})?)\s*([A-Za-z]*)\s*")

_TOKEN_UNITS = {"": 1, "k": 1_000, "K": 1_000, "M": 1_000_000}
_TIME_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}
_BYTE_UNITS = {
    "": 1,
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
}

_AXES: dict[str, tuple[str, dict[str, int]]] = {
    "tokens": ("tokens", _TOKEN_UNITS),
    "wall": ("wall_ms", _TIME_UNITS_MS),
    "cpu": ("cpu_ms", _TIME_UNITS_MS),
    "mem": ("mem_bytes", _BYTE_UNITS),
    "egress": ("egress_bytes", _BYTE_UNITS),
}


def _parse_quantity(axis: str, text: str, units: dict[str, int]) -> int:
    match = _NUMBER.fullmatch(text)
    if match is None or match.group(2) not in units:
        allowed = ", ".join(u for u in units if u) or "none"
        raise BudgetSyntaxError(
            f"budget axis {axis!r}: cannot read {text!r}; write a number with one of the "
            f"units {allowed} (for example tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB)"
        )
    # Exact decimal arithmetic: 2.01s is 2010 ms, and large counts are not rounded.
    value = Decimal(match.group(1)) * units[match.group(2)]
    if value != value.to_integral_value():
        raise BudgetSyntaxError(f"budget axis {axis!r}: {text!r} is not a whole number")
    if value > INT64_MAX:
        raise BudgetSyntaxError(
            f"budget axis {axis!r}: {text!r} is more than the largest amount ({INT64_MAX})"
        )
    return int(value)


def parse_duration_ms(text: str) -> int:
    """A duration written as a budget's time axes are (``90s``, ``10m``, ``1.5h``; the
    unit is required), in milliseconds. Raises BudgetSyntaxError."""
    return _parse_quantity("duration", text, _TIME_UNITS_MS)


class Budget(CheckedModel):
    """A non-negative amount on each of the five axes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    AXES: ClassVar[tuple[str, ...]] = ("tokens", "wall_ms", "cpu_ms", "mem_bytes", "egress_bytes")

    tokens: int = Field(ge=0, le=INT64_MAX)
    wall_ms: int = Field(ge=0, le=INT64_MAX)
    cpu_ms: int = Field(ge=0, le=INT64_MAX)
    mem_bytes: int = Field(ge=0, le=INT64_MAX)
    egress_bytes: int = Field(ge=0, le=INT64_MAX)

    @classmethod
    def parse(cls, text: str) -> Budget:
        """Read ``tokens=…,wall=…,cpu=…,mem=…,egress=…`` (all five axes, any order)."""
        values: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, quantity = part.partition("=")
            name = name.strip()
            if not sep or name not in _AXES:
                raise BudgetSyntaxError(
                    f"budget part {part!r}: expected NAME=QUANTITY with NAME one of "
                    f"{', '.join(_AXES)}"
                )
            field, units = _AXES[name]
            if field in values:
                raise BudgetSyntaxError(f"budget axis {name!r} is given twice")
            values[field] = _parse_quantity(name, quantity, units)
        missing = [name for name, (field, _) in _AXES.items() if field not in values]
        if missing:
            raise BudgetSyntaxError(
                f"budget is missing {', '.join(missing)}: give all five axes, for example "
                "tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB"
            )
        return cls(**values)

    @classmethod
    def zero(cls) -> Budget:
        return cls(tokens=0, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)

    def fits_within(self, other: Budget) -> bool:
        """True when no axis of ``self`` exceeds the same axis of ``other``."""
        return all(getattr(self, a) <= getattr(other, a) for a in self.AXES)

    def minimum(self, other: Budget) -> Budget:
        """Axis-wise minimum: the narrower of two budgets."""
        return Budget(**{a: min(getattr(self, a), getattr(other, a)) for a in self.AXES})

    def __add__(self, other: Budget) -> Budget:
        return Budget(**{a: getattr(self, a) + getattr(other, a) for a in self.AXES})

    def saturating_sub(self, other: Budget) -> Budget:
        """Axis-wise ``self - other``, floored at zero."""
        return Budget(**{a: max(0, getattr(self, a) - getattr(other, a)) for a in self.AXES})

    def split(self, parts: int) -> Budget:
        """Axis-wise ``self // parts``: one of ``parts`` equal shares (rounded down)."""
        if parts < 1:
            raise BudgetSyntaxError(f"cannot split a budget into {parts} parts")
        return Budget(**{a: getattr(self, a) // parts for a in self.AXES})

    def render(self) -> str:
        """The human form, exact (no rounding): ``tokens=…,wall=…ms,…``."""
        return (
            f"tokens={self.tokens},wall={self.wall_ms}ms,cpu={self.cpu_ms}ms,"
            f"mem={self.mem_bytes}B,egress={self.egress_bytes}B"
        )


# -- the five axes as a plain tuple, for the folds' hot paths ---------------------------
# (Budget arithmetic validates every result: ~2 µs an operation, against ~0.1 µs here.)

Vec = tuple[int, int, int, int, int]
VEC_ZERO: Vec = (0, 0, 0, 0, 0)


def vec_of(b: Budget) -> Vec:
    return (b.tokens, b.wall_ms, b.cpu_ms, b.mem_bytes, b.egress_bytes)


# What ``Budget.model_construct`` sets, set directly (it walks every field's aliases and
# defaults first: ~3x the cost, on the folds' hottest path). Checked below, at import:
# a Budget with a post-init hook, private attributes or other fields would need more.
_new, _set = object.__new__, object.__setattr__
if (
    tuple(Budget.model_fields) != Budget.AXES
    or Budget.__pydantic_post_init__
    or Budget.__private_attributes__
    or Budget.__pydantic_root_model__
):  # pragma: no cover - a change to Budget that budget_of must follow
    raise RuntimeError("budget_of builds Budgets field by field: update it with Budget")


def budget_of(v: Vec) -> Budget:
    """A Budget from a vector the folds computed (non-negative by construction): what
    ``Budget.model_construct`` builds, without its walk of the fields."""
    b = _new(Budget)
    _set(
        b,
        "__dict__",
        {"tokens": v[0], "wall_ms": v[1], "cpu_ms": v[2], "mem_bytes": v[3], "egress_bytes": v[4]},
    )
    _set(b, "__pydantic_fields_set__", {"tokens", "wall_ms", "cpu_ms", "mem_bytes", "egress_bytes"})
    _set(b, "__pydantic_extra__", None)
    _set(b, "__pydantic_private__", None)
    return b


def vec_add(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


def vec_sub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3], a[4] - b[4])


def vec_sat_sub(a: Vec, b: Vec) -> Vec:
    """``a - b`` per axis, never below zero."""
    return (
        max(0, a[0] - b[0]),
        max(0, a[1] - b[1]),
        max(0, a[2] - b[2]),
        max(0, a[3] - b[3]),
        max(0, a[4] - b[4]),
    )


def vec_min(a: Vec, b: Vec) -> Vec:
    return (min(a[0], b[0]), min(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]), min(a[4], b[4]))
