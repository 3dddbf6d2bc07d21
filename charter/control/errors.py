"""Errors of the command handlers that are not a domain's own, over the fault groups in
:mod:`charter.core.errors`."""

from __future__ import annotations

from charter.core.errors import RefusedError, StateError

__all__ = [
    "CellSupersededError",
    "DelegationRefusedError",
    "NestedDelegationError",
    "NoCellOfClassError",
    "NotOwnSandboxError",
    "OutwardKeyReusedError",
    "OutwardPendingError",
]


class CellSupersededError(StateError):
    """This incarnation of a cell is fenced: a newer incarnation took its cell over (its
    ``CellStarted`` moved the cell's run stream past this one's claim), or this one's
    claim lapsed before it could renew it. It stops starting work, kills the sandboxes
    it still holds and ends (whoever takes the cell over fails their workers)."""


class OutwardKeyReusedError(RefusedError):
    """An idempotency key of this lease was used for another request (another digest):
    nothing is sent."""

    reason = "outward-key-reused"


class OutwardPendingError(RefusedError):
    """The first call with this key is still being sent by this process: ask again for
    its outcome once it is recorded."""

    reason = "outward-pending"


class DelegationRefusedError(RefusedError, abstract=True):
    """A ``delegate`` that did not happen (journaled as ``DelegationRefused``)."""


class NotOwnSandboxError(DelegationRefusedError):
    """The agent named is not a durable agent declared with its own sandbox
    (``charter agent add NAME --own-sandbox``): nothing is delegated to it."""

    reason = "not-own-sandbox"


class NestedDelegationError(DelegationRefusedError):
    """A delegate asked to delegate: delegation is one level deep."""

    reason = "nested-delegation"


class NoCellOfClassError(RefusedError):
    """A worker of the fan-out asks a class of cell (``WorkerSpec.cell_class``) that no
    live cell has (none runs with ``charter cell run --class NAME``): the fan-out is
    refused, journaled, with nothing minted (docs/fabric.md)."""

    reason = "no-cell-of-class"
