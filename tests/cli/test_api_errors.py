"""Issue 20 point 6: the Python API's promise that every error is a CharterError holds
for the public request types too: a bad ``SpawnIntent`` or ``RequestedGrant`` is a
``BadInputError`` with a readable message, and their JSON Schema is unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

import charter
from charter.authority import spawn_tool_definition
from tests.cli._run import ROOT
from tests.cli._run import charter as run

COST = {"tokens": 1, "wall_ms": 1, "cpu_ms": 1, "mem_bytes": 0, "egress_bytes": 0}

BAD: list[tuple[str, Callable[[], Any], str]] = [
    (
        "width 0",
        lambda: charter.SpawnIntent(width=0, objective="x", estimated_cost=charter.Budget.zero()),
        "width: Input should be greater than or equal to 1",
    ),
    (
        "no objective",
        lambda: charter.SpawnIntent(width=1, objective="", estimated_cost=charter.Budget.zero()),
        "objective: String should have at least 1 character",
    ),
    (
        "a bad tool name, nested",
        lambda: charter.SpawnIntent.model_validate(
            {"width": 1, "objective": "x", "estimated_cost": COST, "grant": {"tools": ["rm -rf"]}}
        ),
        "grant.tools.0: tool name 'rm -rf'",
    ),
    (
        "an identity field",
        lambda: charter.SpawnIntent.model_validate(
            {"width": 1, "objective": "x", "estimated_cost": COST, "issuer": "agent:root"}
        ),
        "issuer: Extra inputs are not permitted",
    ),
    (
        "a grant from JSON",
        lambda: charter.RequestedGrant.model_validate_json('{"depth": -1}'),
        "depth: Input should be greater than or equal to 0",
    ),
    (
        "a grant built directly",
        lambda: charter.RequestedGrant(ttl_s=0),
        "ttl_s: Input should be greater than or equal to 1",
    ),
]


@pytest.mark.parametrize(("case", "build", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_request_is_a_bad_input_error_with_a_readable_message(
    case: str, build: Callable[[], Any], says: str
) -> None:
    with pytest.raises(charter.CharterError) as caught:
        build()
    error = caught.value
    assert isinstance(error, charter.BadInputError)
    message = str(error)
    assert says in message
    assert message.startswith(("invalid SpawnIntent: ", "invalid RequestedGrant: "))
    for noise in ("pydantic", "https://", "type=", "input_value", "\n"):
        assert noise not in message, (noise, message)
    # still pydantic's error too: .errors() and `except ValidationError` keep working
    assert isinstance(error, ValidationError)
    assert error.errors()


def test_a_good_request_still_builds() -> None:  # control
    intent = charter.SpawnIntent(
        width=2, objective="x", estimated_cost=charter.Budget.zero(), grant={"depth": 1}
    )  # type: ignore[arg-type]
    assert intent.grant.depth == 1
    assert charter.SpawnIntent.model_validate(intent.model_dump()) == intent


def test_the_spawn_schema_is_unchanged() -> None:
    golden = json.loads((ROOT / "tests" / "cli" / "data" / "spawn-schema.json").read_text())
    assert spawn_tool_definition() == golden
    done = run("spawn-schema")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == golden


def test_the_cli_still_says_which_value_is_wrong(tmp_path: Any) -> None:
    done = run(
        "spawn", "--parent", "agent:root", "--width", "1", "--objective", "",
        "--est-cost", "tokens=1,wall=1s,cpu=1s,mem=0,egress=0", home=tmp_path / "home",
    )  # fmt: skip
    assert done.returncode == 2
    assert "objective: String should have at least 1 character" in done.stderr
    assert "https://" not in done.stderr
