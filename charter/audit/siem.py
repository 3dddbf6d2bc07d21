"""A flat JSON Lines export for log pipelines (SIEM): one object per entry, decoded.

Each line holds ``position``, ``type``, ``schema`` (the type's version), ``recorded_at``
(ISO 8601), ``hash``, ``prev_hash``, ``stream`` (UUID) and ``stream_version``, then the
payload flattened under ``payload.``: a nested object becomes dotted keys
(``payload.allocation.tokens``), a list of scalars stays a list, a list of objects
becomes indexed keys (``payload.items.0.name``), and a string that holds a JSON object
or array (a grant's canonical ``body``) is decoded and flattened the same way, so no
value is an object and no string holds JSON. Pure: works on stored rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

__all__ = ["flat_record", "flatten", "lines"]

_SCALARS = (str, int, float, bool, type(None))


def _decoded(value: str) -> Any:
    """The JSON container a string holds, or None when it holds none."""
    if not value.startswith(("{", "[")):
        return None
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict | list) else None


def flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    """Put ``value`` into ``out`` under ``prefix``, flat (see the module's rules)."""
    if isinstance(value, str):
        inner = _decoded(value)
        if inner is not None:
            flatten(prefix, inner, out)
            return
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{prefix}.{key}", item, out)
    elif isinstance(value, list) and all(
        isinstance(v, _SCALARS) and not (isinstance(v, str) and _decoded(v) is not None)
        for v in value
    ):
        out[prefix] = value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            flatten(f"{prefix}.{i}", item, out)
    else:
        out[prefix] = value


def flat_record(row: Iterable[Any], originator: bytes) -> dict[str, Any]:
    """One stored row ``(position, oid, version, topic, state, prev, chain)`` as a flat
    record (``originator`` is the row's stream as 16 raw bytes)."""
    position, _, version, topic, state, prev, chain = row
    doc = orjson.loads(bytes(state))
    name, _, schema = str(topic).partition("/v")
    record: dict[str, Any] = {
        "position": position,
        "type": name,
        "schema": int(schema) if schema.isdigit() else schema,
        "recorded_at": doc.get("at"),
        "hash": bytes(chain).hex(),
        "prev_hash": bytes(prev).hex(),
        "stream": str(uuid.UUID(bytes=originator)),
        "stream_version": version,
    }
    flatten("payload", doc.get("payload", {}), record)
    return record


def lines(records: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    """Each record as one JSON line (sorted keys, ``\\n``-terminated)."""
    for record in records:
        yield orjson.dumps(record, option=orjson.OPT_SORT_KEYS) + b"\n"
