"""Where the cell's warm pool reports: the brokers' events to the journal, the sandbox
lifecycle left to the cell."""

from __future__ import annotations

from collections.abc import Sequence

from charter.core import Event
from charter.ledger import Journal
from charter.sandbox import SandboxDiscarded, SandboxExited, SandboxLeased, SandboxStarted

__all__ = ["BrokerEvents"]


_CELLS_OWN = (SandboxLeased, SandboxStarted, SandboxExited, SandboxDiscarded)


class BrokerEvents:
    """The cell's pool's sink: what the egress broker journals (``EgressOpened`` before
    each connection it opens, ``EgressAttempted`` at a sandbox's exit) and anything
    else the pool reports goes to the journal; the sandbox lifecycle the pool would
    journal is left out, because the cell journals it itself, pinned to the worker's
    stream and in order with the worker's own events."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def append(self, events: Sequence[Event]) -> object:
        kept = [e for e in events if not isinstance(e, _CELLS_OWN)]
        return self.journal.append(kept) if kept else None
