"""The event catalogue: importing this module registers every event type Charter
writes, so any reader (``journal show``, projections, auditors' tools) can decode any
entry, whichever package wrote it."""

from __future__ import annotations

from charter.ledger import admission, journal, leases, lifecycle, resources
from charter.ledger.authority import _events as authority
from charter.ledger.events import Event, event_types

__all__ = ["MODULES", "catalogue"]

MODULES = (journal, authority, leases, admission, resources, lifecycle)


def catalogue() -> dict[str, type[Event]]:
    """Every registered event type by name."""
    return event_types()
