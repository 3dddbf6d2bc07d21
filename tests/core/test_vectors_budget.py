"""Known answers for the budget vector: every unit, the limits of a quantity, exact
decimal reading, and the arithmetic the leases and grants are computed with."""

from __future__ import annotations

import pytest

from charter.core import Budget, BudgetSyntaxError
from charter.core.budget import (
    INT64_MAX,
    MAX_TTL_S,
    VEC_ZERO,
    budget_of,
    parse_duration_ms,
    vec_add,
    vec_min,
    vec_of,
    vec_sat_sub,
    vec_sub,
)

REST = "wall=0ms,cpu=0ms,mem=0B,egress=0B"


@pytest.mark.parametrize(
    ("axis", "quantity", "expected"),
    [
        ("tokens", "3", 3),
        ("tokens", "3k", 3_000),
        ("tokens", "3K", 3_000),
        ("tokens", "3M", 3_000_000),
        ("wall", "3ms", 3),
        ("wall", "3s", 3_000),
        ("wall", "3m", 180_000),
        ("wall", "3h", 10_800_000),
        ("cpu", "0.5s", 500),
        ("mem", "3", 3),
        ("mem", "3B", 3),
        ("mem", "3KiB", 3_072),
        ("mem", "3MiB", 3_145_728),
        ("mem", "3GiB", 3_221_225_472),
        ("mem", "3KB", 3_000),
        ("mem", "3MB", 3_000_000),
        ("mem", "3GB", 3_000_000_000),
        ("egress", "1.000000001GB", 1_000_000_001),  # nine fraction digits, exact
        ("egress", " 7 MB ", 7_000_000),
        ("tokens", "000000000000000000000042", 42),  # 24 digits
        ("tokens", str(INT64_MAX), INT64_MAX),
    ],
)
def test_every_unit_of_every_axis(axis: str, quantity: str, expected: int) -> None:
    parts = dict(p.split("=") for p in ("tokens=0," + REST).split(","))
    parts[axis] = quantity
    budget = Budget.parse(",".join(f"{k}={v}" for k, v in parts.items()))
    field = {"wall": "wall_ms", "cpu": "cpu_ms", "mem": "mem_bytes", "egress": "egress_bytes"}
    assert getattr(budget, field.get(axis, axis)) == expected
    others = [a for a in Budget.AXES if a != field.get(axis, axis)]
    assert all(getattr(budget, a) == 0 for a in others)


@pytest.mark.parametrize(
    ("quantity", "why"),
    [
        (str(INT64_MAX + 1), "largest amount"),
        ("9223372036854776k", "largest amount"),
        ("0000000000000000000000042", "cannot read"),  # 25 digits
        ("1.0000000001", "cannot read"),  # ten fraction digits
        ("\U0001d7d7", "cannot read"),  # a mathematical digit nine, not an ASCII 9
        ("٣", "cannot read"),  # an Arabic-Indic three
        ("1.5", "not a whole number"),
        ("", "cannot read"),
        ("k", "cannot read"),
        ("1 k k", "cannot read"),
        ("1e3", "cannot read"),
        ("+1", "cannot read"),
    ],
)
def test_quantities_outside_the_grammar_are_refused(quantity: str, why: str) -> None:
    with pytest.raises(BudgetSyntaxError, match=why):
        Budget.parse(f"tokens={quantity},{REST}")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("tokens=1," + REST + ",tokens=2", "given twice"),
        ("tokens=1,wall=0ms,cpu=0ms,mem=0B", "missing egress"),
        ("wall=0ms,cpu=0ms,mem=0B,egress=0B", "missing tokens"),
        ("tokens:1," + REST, "NAME=QUANTITY"),
        ("Tokens=1," + REST, "NAME=QUANTITY"),
        ("", "missing tokens, wall, cpu, mem, egress"),
    ],
)
def test_malformed_budgets_are_refused_with_their_reason(text: str, why: str) -> None:
    with pytest.raises(BudgetSyntaxError, match=why):
        Budget.parse(text)


def test_empty_parts_and_spaces_around_names_are_allowed() -> None:
    b = Budget.parse(" tokens = 1 ,, wall=2ms,cpu=3ms, mem=4B,egress=5B,")
    assert vec_of(b) == (1, 2, 3, 4, 5)


def test_render_is_exact_and_reads_back() -> None:
    b = Budget(tokens=1, wall_ms=2, cpu_ms=3, mem_bytes=4, egress_bytes=INT64_MAX)
    assert b.render() == f"tokens=1,wall=2ms,cpu=3ms,mem=4B,egress={INT64_MAX}B"
    assert Budget.parse(b.render()) == b


def test_each_axis_is_bounded_by_what_the_databases_store() -> None:
    Budget(tokens=INT64_MAX, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)
    for axis in Budget.AXES:
        values = dict.fromkeys(Budget.AXES, 0)
        with pytest.raises(ValueError, match="less than or equal"):
            Budget(**(values | {axis: INT64_MAX + 1}))
        with pytest.raises(ValueError, match="greater than or equal"):
            Budget(**(values | {axis: -1}))
    assert MAX_TTL_S == 3_162_240_000


A = Budget(tokens=5, wall_ms=10, cpu_ms=9, mem_bytes=7, egress_bytes=3)
B = Budget(tokens=3, wall_ms=20, cpu_ms=8, mem_bytes=7, egress_bytes=4)


def test_budget_arithmetic_axis_by_axis() -> None:
    assert vec_of(A + B) == (8, 30, 17, 14, 7)
    assert vec_of(A.minimum(B)) == (3, 10, 8, 7, 3)
    assert vec_of(A.saturating_sub(B)) == (2, 0, 1, 0, 0)
    assert vec_of(B.saturating_sub(A)) == (0, 10, 0, 0, 1)
    assert not A.fits_within(B)
    assert not B.fits_within(A)
    assert A.minimum(B).fits_within(A)
    assert A.fits_within(A)
    assert vec_of(Budget.zero()) == VEC_ZERO
    assert vec_of(A.split(2)) == (2, 5, 4, 3, 1)
    assert A.split(1) == A
    for parts in (0, -1):
        with pytest.raises(BudgetSyntaxError, match="parts"):
            A.split(parts)


def test_the_plain_vector_arithmetic_agrees_with_budget_arithmetic() -> None:
    a, b = vec_of(A), vec_of(B)
    assert vec_add(a, b) == vec_of(A + B)
    assert vec_min(a, b) == vec_of(A.minimum(B))
    assert vec_sat_sub(a, b) == vec_of(A.saturating_sub(B))
    assert vec_sat_sub(b, a) == vec_of(B.saturating_sub(A))
    assert vec_min(b, a) == vec_min(a, b)
    assert vec_sub(a, b) == (2, -10, 1, 0, -1)
    assert budget_of(a) == A
    assert budget_of(vec_add(a, b)) == A + B


def test_parse_duration_ms_reads_time_units() -> None:
    assert parse_duration_ms("90s") == 90_000
    assert parse_duration_ms("1.5h") == 5_400_000


def test_parse_duration_ms_names_the_duration_in_its_refusal() -> None:
    with pytest.raises(BudgetSyntaxError) as caught:
        parse_duration_ms("10")
    assert str(caught.value) == (
        "budget axis 'duration': cannot read '10'; write a number with one of the units "
        "ms, s, m, h (for example tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB)"
    )
