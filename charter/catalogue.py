"""The event catalogue: importing this module registers every event type Charter
writes, so any reader (``journal show``, projections, auditors' tools) can decode any
entry, whichever package wrote it."""

from __future__ import annotations

# Imported for their registrations only.
from charter import audit, authority, budgets, control, ledger, sandbox, supervision  # noqa: F401
from charter.audit import rotation as _rotation  # noqa: F401
from charter.ledger import journal as _journal  # noqa: F401
from charter.runner import events as _runner_events  # noqa: F401
