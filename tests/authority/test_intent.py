"""The spawn intent carries no identity; its schema is a model tool definition."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from charter.authority import SpawnIntent, spawn_tool_definition

VALID: dict[str, Any] = {
    "width": 3,
    "objective": "review each module",
    "grant": {"tools": ["Read"], "depth": 1},
    "estimated_cost": {
        "tokens": 1000,
        "wall_ms": 1000,
        "cpu_ms": 1000,
        "mem_bytes": 1000,
        "egress_bytes": 0,
    },
}

IDENTITY_FIELDS = [
    "issuer",
    "lineage",
    "root",
    "cell",
    "parent",
    "agent",
    "actor",
    "caller",
    "subject",
    "subject_key",
    "identity",
    "trust_root",
    "custody_key",
    "parent_digest",
]


def test_valid_intent_parses() -> None:
    intent = SpawnIntent.model_validate(VALID)
    assert intent.width == 3
    assert intent.grant.tools == frozenset({"Read"})


@pytest.mark.parametrize("field", IDENTITY_FIELDS)
def test_an_identity_field_anywhere_is_rejected(field: str) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SpawnIntent.model_validate(VALID | {field: "agent:root"})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SpawnIntent.model_validate(VALID | {"grant": VALID["grant"] | {field: "agent:root"}})


def test_unknown_fields_and_bad_values_are_rejected() -> None:
    with pytest.raises(ValidationError):
        SpawnIntent.model_validate(VALID | {"priority": "high"})
    for bad in ({"width": 0}, {"width": 10_001}, {"objective": ""}):
        with pytest.raises(ValidationError):
            SpawnIntent.model_validate(VALID | bad)
    with pytest.raises(ValidationError, match="egress destination"):
        SpawnIntent.model_validate(VALID | {"grant": {"egress": ["http://x.com"]}})
    with pytest.raises(ValidationError):
        SpawnIntent.model_validate(VALID | {"grant": {"clearance": "top-secret"}})


def _walk(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        found.append(node)
        for v in node.values():
            found.extend(_walk(v))
    elif isinstance(node, list):
        for v in node:
            found.extend(_walk(v))
    return found


def test_schema_is_a_self_contained_tool_definition_without_identity() -> None:
    tool = spawn_tool_definition()
    assert tool["name"] == "spawn"
    assert tool["description"]
    schema = tool["input_schema"]
    assert schema["type"] == "object"
    assert set(schema["required"]) == {"width", "objective", "estimated_cost"}
    text = json.dumps(schema)
    assert "$ref" not in text
    assert "$defs" not in text
    properties = set()
    for node in _walk(schema):
        if node.get("type") == "object":
            assert node.get("additionalProperties") is False  # closed at every level
            properties |= set(node.get("properties", {}))
    assert properties.isdisjoint(IDENTITY_FIELDS)
    assert {"width", "objective", "grant", "estimated_cost", "tools", "egress"} <= properties
