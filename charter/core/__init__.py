"""The shared vocabulary every layer speaks, pure: errors and their fault groups, the
budget vector, the event base and registry, every hash domain and framing, the clock,
lineage addressing, egress destinations, and the Charter home with its keys.

The pydantic models (``CheckedModel``, ``Budget``, ``Event``, ``Lineage``…) are loaded
when first asked for (``from charter.core import Budget`` works as always): importing
the package, or its pure modules (``errors``, ``framing``, ``clock``, ``home``), loads
no pydantic, so the auditor's light commands (``charter proof``, ``checkpoint key``)
start in a fraction of its import time (bench/audit.py --startup).
"""

from typing import TYPE_CHECKING

from charter.core.clock import Clock, entry_ms, now_ms
from charter.core.errors import (
    AxisValueError,
    BadInputError,
    BudgetSyntaxError,
    CharterError,
    HomeUnusableError,
    InternalError,
    JournalMissingError,
    KeyNotFoundError,
    KeyPermissionsError,
    LineageError,
    RefusedError,
    StateError,
    TamperedError,
    UnavailableError,
    UnknownEventTypeError,
    describe_invalid,
)
from charter.core.home import KeyStore, charter_home
from charter.core.lazy import lazy_names

if TYPE_CHECKING:
    from charter.core._model import CheckedModel
    from charter.core.budget import Budget
    from charter.core.errors import InvalidModelError
    from charter.core.events import Event, canonical_json, event_class
    from charter.core.lineage import MAX_LINEAGE_DEPTH, Lineage

__all__ = [
    # errors
    "CharterError",
    "BadInputError",
    "StateError",
    "UnavailableError",
    "TamperedError",
    "RefusedError",
    "InternalError",
    "AxisValueError",
    "BudgetSyntaxError",
    "LineageError",
    "InvalidModelError",
    "HomeUnusableError",
    "JournalMissingError",
    "KeyNotFoundError",
    "KeyPermissionsError",
    "describe_invalid",
    # the base of the public models (bad values raise InvalidModelError)
    "CheckedModel",
    # values
    "Budget",
    "Lineage",
    "MAX_LINEAGE_DEPTH",
    # events
    "Event",
    "UnknownEventTypeError",
    "canonical_json",
    "event_class",
    # time
    "Clock",
    "now_ms",
    "entry_ms",
    # home and keys
    "KeyStore",
    "charter_home",
]

# name -> the module that defines it, imported on first access (they import pydantic)
_LAZY = {
    "InvalidModelError": "charter.core.errors",
    "CheckedModel": "charter.core._model",
    "Budget": "charter.core.budget",
    "Event": "charter.core.events",
    "canonical_json": "charter.core.events",
    "event_class": "charter.core.events",
    "Lineage": "charter.core.lineage",
    "MAX_LINEAGE_DEPTH": "charter.core.lineage",
}


__getattr__ = lazy_names(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
