"""The operator's trifecta policy, read from the home (docs/scan.md).

``<home>/trifecta.json`` names the lineages whose grants may hold the lethal trifecta
(each with its whole subtree)::

    {"allow": ["agent:estate", "agent:ops/sa-1"]}

Absent, nothing is allowed. The bindings of the held secrets a grant names come from the
home's secret store (a secret the store does not hold is bound to nothing). Read at a
process's first fan-out (a cell's first spawn, or its door's): restart a cell after
editing it. A process that never spawns (an auditor's) never reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from charter.authority import TrifectaPolicy
from charter.core import BadInputError, CharterError, Lineage
from charter.core.secrets import SecretStore

__all__ = ["POLICY_FILE", "home_trifecta"]

POLICY_FILE = "trifecta.json"


def home_trifecta(home: Path) -> TrifectaPolicy:
    """The policy ``<home>/trifecta.json`` states, with the home's secret bindings; a
    file that is not that shape is refused (BadInputError), never read as allowing."""
    path = home / POLICY_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        doc = {"allow": []}
    except (OSError, ValueError) as e:
        raise BadInputError(f"{path}: not readable JSON ({e})") from e
    allow = doc.get("allow") if isinstance(doc, dict) else None
    if not isinstance(allow, list) or set(doc) - {"allow"}:
        raise BadInputError(f'{path}: write {{"allow": ["agent:NAME", "LINEAGE", ...]}}')
    try:
        lineages = frozenset(str(Lineage(str(x))) for x in allow)
    except CharterError as e:
        raise BadInputError(f"{path}: {e}") from e
    store = SecretStore(home)

    def bindings(name: str) -> tuple[str, ...]:
        try:
            return store.load(name).bound_to
        except CharterError:  # not held (or not openable): bound to nothing
            return ()

    return TrifectaPolicy(bindings=bindings, allow=lineages)
