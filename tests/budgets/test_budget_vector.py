"""Reading budget vectors: exact, whole, every axis."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from charter.core import Budget, BudgetSyntaxError
from charter.core.budget import budget_of, vec_of


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


def test_a_budget_from_a_fold_vector_is_the_one_pydantic_constructs() -> None:
    """``budget_of`` sets a Budget's state itself (the folds' hot path): it must be
    what ``model_construct`` builds, attribute for attribute, and behave as one."""
    v = (7, 0, 3, 2**63 - 1, 1)
    made = budget_of(v)
    model = Budget.model_construct(**dict(zip(Budget.AXES, v, strict=True)))
    assert type(made) is Budget
    assert made.__dict__ == model.__dict__
    assert made.__pydantic_fields_set__ == model.__pydantic_fields_set__
    assert made.__pydantic_extra__ is None
    assert made.__pydantic_private__ is None
    assert made == model
    assert hash(made) == hash(model)
    assert made.model_dump_json() == model.model_dump_json()
    assert pickle.loads(pickle.dumps(made)) == made
    assert vec_of(made) == v
    with pytest.raises(ValidationError):  # frozen, as every Budget
        made.tokens = 1  # type: ignore[misc]
    made.__pydantic_fields_set__.add("x")  # a set of its own, as model_construct's
    assert budget_of(v).__pydantic_fields_set__ == model.__pydantic_fields_set__
