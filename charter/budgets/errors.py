"""Errors of the budgets package (leases, admission, fabric ceilings), over the fault
groups in :mod:`charter.core.errors`. Each refusal has its own stable ``reason`` code."""

from __future__ import annotations

from typing import ClassVar

from charter.core.errors import BadInputError, RefusedError, StateError
from charter.core.events import Event

__all__ = [
    "BudgetRefusedError",
    "NoBudgetLedgerError",
    "InsufficientBudgetError",
    "LeaseEndedError",
    "RenewalBeyondParentError",
    "RenewalBeyondGrantError",
    "ExpiryOutOfRangeError",
    "AdmissionRefusedError",
    "SlotReleaseRacedError",
    "UnknownCellError",
    "UnknownLeaseError",
    "PopulationCeilingError",
    "DepthCeilingError",
]


class BudgetRefusedError(RefusedError, abstract=True):
    """Refused by budget policy (exit 4). ``reason`` is a stable code for the journal."""

    reason: ClassVar[str] = "budget"


class NoBudgetLedgerError(BudgetRefusedError):
    """The agent has no budget ledger, so it cannot spend or spawn (fail closed)."""

    reason = "no-budget-ledger"


class InsufficientBudgetError(BudgetRefusedError):
    """The requested leases do not fit in what the parent still holds."""

    reason = "insufficient-budget"


class LeaseEndedError(BudgetRefusedError):
    """The lease was released or has expired; nothing more can be recorded against it."""

    reason = "lease-ended"


class RenewalBeyondParentError(BudgetRefusedError):
    """A renewal would outlive the parent's own lease."""

    reason = "renewal-beyond-parent"


class RenewalBeyondGrantError(BudgetRefusedError):
    """A renewal would outlive the sealed grant the lease was granted under: the worker
    would hold budget after its authority to spend it has expired."""

    reason = "renewal-beyond-grant"


class ExpiryOutOfRangeError(BudgetRefusedError):
    """A lease's end would lie past the last instant Charter renders and stores as a
    date (:data:`charter.budgets.leases.MAX_EXPIRY_MS`, the end of year 9999)."""

    reason = "expiry-out-of-range"


class AdmissionRefusedError(RefusedError):
    """Over cap: backpressure. ``retry_after_ms`` says when to try again.

    ``refusal`` is the event to journal for it (the decision that refused builds it, so
    every caller journals the same thing, once)."""

    reason: ClassVar[str] = "admission"

    def __init__(self, message: str, *, retry_after_ms: int, refusal: Event | None = None) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms
        self.refusal = refusal


class SlotReleaseRacedError(StateError):
    """A slot's release kept losing races with other writers on its cell for longer
    than the journal's own lock timeout: the slot is still held, and the release must
    be retried (the error says which)."""


class UnknownCellError(StateError):
    """No cell of that name has been configured."""


class UnknownLeaseError(BadInputError):
    """No ledger or lease for this lineage was ever journaled (a typo, most often): bad
    input, answered before anything is journaled, not a policy refusal."""


class PopulationCeilingError(RefusedError):
    """The fabric already runs as many workers as its population ceiling allows."""

    reason = "population-ceiling"


class DepthCeilingError(RefusedError):
    """The fan-out would place workers deeper than the fabric's depth ceiling."""

    reason = "depth-ceiling"
