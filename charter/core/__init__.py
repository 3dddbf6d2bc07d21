"""The shared vocabulary every layer speaks, pure: errors and their fault groups, the
budget vector, the event base and registry, every hash domain and framing, the clock,
lineage addressing, egress destinations, and the Charter home with its keys."""

from charter.core._model import CheckedModel
from charter.core.budget import Budget
from charter.core.clock import Clock, entry_ms, now_ms
from charter.core.errors import (
    AxisValueError,
    BadInputError,
    BudgetSyntaxError,
    CharterError,
    HomeUnusableError,
    InternalError,
    InvalidModelError,
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
from charter.core.events import Event, canonical_json, event_class
from charter.core.home import KeyStore, charter_home
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
