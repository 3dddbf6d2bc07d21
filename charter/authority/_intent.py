"""The spawn intent: the only thing a model (or operator) can send to ask for a fan-out.

It says *what* is wanted, never *who* is asking: there is no issuer, lineage, root, cell
or any other identity field, and unknown fields are rejected (``extra="forbid"``). The
parent is resolved on the server side from the caller's sealed grant and custody key.

Building either request type with a bad value raises ``InvalidRequestError``
(``charter.authority.errors``), a ``BadInputError`` whose message names each field and
what is wrong with it, without pydantic's type codes and web links. It is also
pydantic's ``ValidationError``, so ``.errors()`` and code that catches it still work.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ConfigDict, Field

from charter.authority._axes import Clearance, Destination, PermissionMode, SecretName
from charter.authority._axes import ToolName as _ToolName
from charter.authority.errors import InvalidRequestError
from charter.core import CheckedModel
from charter.core.budget import Budget

MAX_FANOUT = 1_000_000  # children one grant may allow in all

__all__ = [
    "RequestedGrant",
    "SpawnIntent",
    "MAX_WIDTH",
    "spawn_tool_definition",
]

MAX_WIDTH = 10_000


class _Request(CheckedModel):
    """Base of the public request types: a bad value raises InvalidRequestError (a
    CharterError), never a bare pydantic error."""

    invalid_error = InvalidRequestError


class RequestedGrant(_Request):
    """What the children should hold. Every axis is optional: an omitted axis asks for
    as much as the parent allows, and whatever is asked is intersected with the parent,
    so asking for more than the parent holds yields the parent's value, never more."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tools: frozenset[_ToolName] | None = Field(
        default=None, description="Tool names the workers may call."
    )
    egress: frozenset[Destination] | None = Field(
        default=None,
        description="Hosts the workers may reach: exact (api.example.com) or *.example.com.",
    )
    secrets: frozenset[SecretName] | None = Field(
        default=None, description="Names of secrets the workers may use."
    )
    clearance: Clearance | None = Field(default=None, description="Highest data clearance.")
    mode: PermissionMode | None = Field(
        default=None, description="Permission mode, least permissive first."
    )
    depth: int | None = Field(
        default=None, ge=0, le=64, description="Levels of spawning the workers may still do."
    )
    fanout: int | None = Field(
        default=None,
        ge=0,
        le=MAX_FANOUT,
        description="Workers each child may spawn in its whole subtree (default none): "
        "carved out of the parent's remaining fan-out, like a budget.",
    )
    budget: Budget | None = Field(default=None, description="Per-worker budget ceiling.")
    ttl_s: int | None = Field(
        default=None, ge=1, le=366 * 86_400, description="Seconds until the grants expire."
    )


class SpawnIntent(_Request):
    """A request to fan out ``width`` workers toward ``objective``."""

    model_config = ConfigDict(frozen=True, extra="forbid", title="spawn")

    width: int = Field(ge=1, le=MAX_WIDTH, description="How many workers to start.")
    objective: str = Field(
        min_length=1, max_length=4000, description="What the workers are for, in plain words."
    )
    grant: RequestedGrant = Field(
        default_factory=RequestedGrant,
        description="Authority asked for each worker; intersected with the parent's.",
    )
    estimated_cost: Budget = Field(
        description="Estimated total cost of the whole fan-out (all workers together)."
    )


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """Replace ``$ref`` to ``$defs`` by the definition, so the schema is self-contained."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            merged = dict(copy.deepcopy(defs[ref.removeprefix("#/$defs/")]))
            merged.update({k: v for k, v in node.items() if k != "$ref"})
            return _inline_refs(merged, defs)
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def spawn_tool_definition() -> dict[str, Any]:
    """The intent's JSON Schema as a model tool definition (``name``, ``description``,
    ``input_schema``), with every reference inlined and no identity field."""
    schema = SpawnIntent.model_json_schema()
    defs = schema.get("$defs", {})
    return {
        "name": "spawn",
        "description": (
            "Ask Charter to fan out workers toward an objective. You state what you want; "
            "who you are is known from your grant. Each worker's authority is what you ask "
            "for intersected with yours; the fan-out may be refused."
        ),
        "input_schema": _inline_refs(schema, defs),
    }
