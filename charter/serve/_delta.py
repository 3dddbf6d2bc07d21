"""The stream's deltas: what changed between two live fabric documents (docs/serve.md,
"The stream").

A fabric document is flattened one level into paths (``position``, ``tree.as_of``,
``tree.nodes``, ``budgets.ledgers``, ``verdicts`` ...). Every path is one of:

- **keyed**: a list of objects, each named by one field (:data:`KEYED`), kept in the
  order of that key (:data:`DESCENDING` paths newest first, the rest ascending);
- **mapped**: an object whose own keys are the keys (:data:`MAPPED`);
- **plain**: anything else, replaced whole when it differs.

A delta is ``{"base", "position", "set", "upsert", "drop"}``: ``set`` holds the plain
paths that changed (their new values); ``upsert`` the items of a keyed path that are new
or differ (a list), or the entries of a mapped path (an object); ``drop`` the keys that
are gone. Applied to the document at ``base`` (set, then drop, then upsert, then each
keyed path re-sorted by its key) it gives the document at ``position``. The page's
script applies the same rules (``static/app.js``, ``applyDelta``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["DESCENDING", "KEYED", "MAPPED", "diff", "paths"]

# keyed path -> the field each item is named by
KEYED = {
    "tree.nodes": "lineage",
    "budgets.ledgers": "lineage",
    "slots.cells": "cell",
    "events": "position",
    "burndown": "position",
}
MAPPED = frozenset({"verdicts"})
DESCENDING = frozenset({"events"})  # newest first; every other keyed path ascending


def paths(document: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """``document`` flattened one level: an object-valued field (not a mapped one)
    gives one path per field of its own."""
    for name, value in document.items():
        if isinstance(value, dict) and name not in MAPPED:
            for inner, item in value.items():
                yield f"{name}.{inner}", item
        else:
            yield name, value


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """The delta from ``old`` to ``new`` (None when their shapes differ: a path added
    or gone, which no delta expresses; the stream sends a snapshot instead)."""
    before = dict(paths(old))
    after = dict(paths(new))
    if before.keys() != after.keys():
        return None
    changed: dict[str, Any] = {}
    upsert: dict[str, Any] = {}
    drop: dict[str, list[Any]] = {}
    for path, value in after.items():
        was = before[path]
        if path in KEYED:
            key = KEYED[path]
            if not (isinstance(was, list) and isinstance(value, list)):
                return None
            keys = [item[key] for item in value]
            if keys != sorted(keys, reverse=path in DESCENDING) or len(set(keys)) != len(keys):
                return None  # not in the documented order: the page could not rebuild it
            old_items = {item[key]: item for item in was}
            new_items = dict(zip(keys, value, strict=True))
            fresh: Any = [item for k, item in new_items.items() if old_items.get(k) != item]
            gone = [k for k in old_items if k not in new_items]
        elif path in MAPPED:
            fresh = {k: v for k, v in value.items() if k not in was or was[k] != v}
            gone = [k for k in was if k not in value]
        else:
            if was != value:
                changed[path] = value
            continue
        if fresh:
            upsert[path] = fresh
        if gone:
            drop[path] = gone
    return {
        "base": old["position"],
        "position": new["position"],
        "set": changed,
        "upsert": upsert,
        "drop": drop,
    }
