"""The event catalogue: importing this module registers every event type Charter
writes, so any reader (``journal show``, projections, auditors' tools) can decode any
entry, whichever package wrote it."""

from __future__ import annotations

# Imported for their registrations only.
from charter.ledger import admission, journal, leases, lifecycle, resources  # noqa: F401
from charter.ledger.authority import _events  # noqa: F401
