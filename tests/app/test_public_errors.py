"""Every type a caller builds from the ``charter`` package raises a CharterError on a
bad value (a BadInputError whose message names the field and what is wrong), never a
bare pydantic ValidationError with pydantic's web links (docs/api.md's promise)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

import charter
from charter.budgets import FabricCeilings
from charter.core import CheckedModel, InvalidModelError

ZERO = {"tokens": 0, "wall_ms": 0, "cpu_ms": 0, "mem_bytes": 0, "egress_bytes": 0}

# name -> (a build with a bad value, the field the message must name, what it must say)
BAD: dict[str, tuple[Callable[[], Any], str, str]] = {
    "Budget": (lambda: charter.Budget(**{**ZERO, "tokens": -1}), "tokens", ">= 0"),
    "Ceiling": (
        lambda: charter.Ceiling(budget=charter.Budget.zero(), depth=-1),
        "depth",
        "greater than or equal to 0",
    ),
    "CellSetup": (lambda: charter.CellSetup(cores=0), "cores", "greater than or equal to 1"),
    "Settings": (lambda: charter.Settings(cell="Not A Cell!"), "cell", "match pattern"),
    "WorkerSpec": (lambda: charter.WorkerSpec(argv=["python3"]), "argv", "absolute"),
    "SpawnIntent": (lambda: charter.SpawnIntent(width=0), "width", "greater than or equal to 1"),
    "RequestedGrant": (lambda: charter.RequestedGrant(fanout=-1), "fanout", ">= 0"),
}


def _message_says(text: str, what: str) -> bool:
    return what in text or (what == ">= 0" and "greater than or equal to 0" in text)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_a_charter_error_naming_the_field(name: str) -> None:
    build, field, says = BAD[name]
    with pytest.raises(charter.CharterError) as raised:
        build()
    error = raised.value
    assert isinstance(error, charter.BadInputError)
    text = str(error)
    assert field in text, text
    assert _message_says(text, says), text
    for leak in ("pydantic", "http", "[type=", "input_value"):
        assert leak not in text, text


def test_validating_data_is_a_charter_error_too() -> None:
    """``model_validate`` (a dict from a config file, say) and nested models: the same."""
    with pytest.raises(InvalidModelError, match=r"budget\.wall_ms: Field required"):
        charter.Ceiling.model_validate({"budget": {"tokens": 1}})
    with pytest.raises(InvalidModelError, match=r"invalid CellSetup: .*leaves none of 2 cores"):
        charter.CellSetup.model_validate_json('{"cores": 2, "reserve": 2}')
    with pytest.raises(InvalidModelError, match="population: Input should be greater"):
        FabricCeilings(population=-1)  # what Settings(ceilings=...) is built from


def test_every_model_the_package_exports_raises_charter_errors() -> None:
    """No exported model is a bare pydantic model (a new one would raise pydantic's
    error): each is a CheckedModel, and each has its bad-input case above. The
    control: a bare model here raises pydantic's own error, not a CharterError."""
    models = {
        name
        for name in charter.__all__
        if isinstance(getattr(charter, name), type)
        and issubclass(getattr(charter, name), BaseModel)
    }
    assert models == set(BAD)
    assert all(issubclass(getattr(charter, name), CheckedModel) for name in models)

    class Bare(BaseModel):
        width: int

    with pytest.raises(Exception) as raised:
        Bare(width="many")  # type: ignore[arg-type]
    assert not isinstance(raised.value, charter.CharterError)
    assert "https://errors.pydantic.dev" in str(raised.value)
