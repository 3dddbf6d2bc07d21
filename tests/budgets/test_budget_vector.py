"""Reading budget vectors: exact, whole, every axis."""

from __future__ import annotations

import pytest

from charter.core import Budget, BudgetSyntaxError


def test_decimal_quantities_are_read_exactly() -> None:
    b = Budget.parse("tokens=1.005k,wall=2.01s,cpu=0.5m,mem=1.5KiB,egress=9007199254740993")
    assert (b.tokens, b.wall_ms, b.cpu_ms, b.mem_bytes) == (1005, 2010, 30_000, 1536)
    assert b.egress_bytes == 9007199254740993  # 2**53 + 1: a float would round it


@pytest.mark.parametrize("bad", ["tokens=1.5", "wall=0.0005s", "mem=1.1B"])
def test_fractions_of_a_unit_are_refused(bad: str) -> None:
    rest = {"tokens": "1", "wall": "1s", "cpu": "1s", "mem": "1B", "egress": "1B"}
    axis = bad.partition("=")[0]
    text = ",".join([bad, *(f"{k}={v}" for k, v in rest.items() if k != axis)])
    with pytest.raises(BudgetSyntaxError, match="not a whole number"):
        Budget.parse(text)
