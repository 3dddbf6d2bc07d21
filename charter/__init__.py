"""Charter: the control plane for AI-agent fan-out.

The Python API is the composition root and the handful of types a caller needs::

    import charter

    with charter.Charter.open() as app:  # --db / CHARTER_DB / the home's journal
        result = app.spawn("agent:estate", charter.SpawnIntent(...))

The names are loaded on first use (PEP 562), so ``import charter`` (and the ``charter``
command's start-up) does not pay for pydantic, the journal or the sandbox until a name
is asked for. See docs/api.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and editors; at run time, __getattr__ below
    from charter.app import CellSetup, Charter, Initialised, Settings
    from charter.authority import RequestedGrant, SpawnIntent
    from charter.control import Ceiling, SpawnResult, WorkerSpec
    from charter.core import (
        BadInputError,
        Budget,
        CharterError,
        Lineage,
        RefusedError,
        StateError,
        TamperedError,
        UnavailableError,
    )
    from charter.ledger import BatchCommittedError, OutcomeUnknownError

__all__ = [
    # the composition root
    "Charter",
    "CellSetup",
    "Settings",
    "Initialised",
    # what a caller builds and gets back
    "SpawnIntent",
    "RequestedGrant",
    "SpawnResult",
    "WorkerSpec",
    "Ceiling",
    "Budget",
    "Lineage",
    # the error base and its fault groups (one exit code each at the CLI)
    "CharterError",
    "BadInputError",
    "StateError",
    "UnavailableError",
    "TamperedError",
    "RefusedError",
    # a retry after a lost connection (request_id= on Charter.spawn)
    "OutcomeUnknownError",
    "BatchCommittedError",
]

_WHERE = {
    "Charter": "charter.app",
    "CellSetup": "charter.app",
    "Settings": "charter.app",
    "Initialised": "charter.app",
    "SpawnIntent": "charter.authority",
    "RequestedGrant": "charter.authority",
    "SpawnResult": "charter.control",
    "WorkerSpec": "charter.control",
    "Ceiling": "charter.control",
    "Budget": "charter.core",
    "Lineage": "charter.core",
    "CharterError": "charter.core",
    "BadInputError": "charter.core",
    "StateError": "charter.core",
    "UnavailableError": "charter.core",
    "TamperedError": "charter.core",
    "RefusedError": "charter.core",
    "OutcomeUnknownError": "charter.ledger",
    "BatchCommittedError": "charter.ledger",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'charter' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    if module == "charter.app":
        loaded.provide_cells(_cell_via_runner, replace=False)
    value = getattr(loaded, name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def _cell_via_runner(app: Any, options: Any) -> Any:
    """``Charter.cell`` for a caller of this package: the runner (the layer above
    charter.app, which cannot import it) is loaded on the first cell, not before."""
    return importlib.import_module("charter.runner.host").build_cell(app, options)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
