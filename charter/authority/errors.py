"""Errors of the authority package, grouped by fault over the fault groups of charter.core.errors.

Each refusal carries a stable ``reason`` code: it is what the journal records in a
``SpawnRefused`` event and what scripts match on, so codes never change meaning.
"""

from __future__ import annotations

from typing import ClassVar

from charter.core import InvalidModelError
from charter.core.errors import BadInputError, RefusedError, StateError

__all__ = [
    # bad input
    "GrantFormatError",
    "InvalidRequestError",
    # state
    "AgentExistsError",
    "UnknownAgentError",
    # refused: who is asking
    "AuthorityRefusedError",
    "CustodyKeyMismatchError",
    "GrantSignatureInvalidError",
    "GrantChainBrokenError",
    "ForeignRootError",
    "GrantNotJournaledError",
    "GrantExpiredError",
    "LineageRevokedError",
    "UnknownParentError",
    # refused: what may be spawned
    "DepthExhaustedError",
    "FanoutExhaustedError",
    # refused: invariants of a minted child
    "InvariantViolationError",
    "DepthNotDecreasingError",
    "AxisWidenedError",
    "ClearanceRaisedError",
    "PermissionModeRaisedError",
    "FanoutNotDecreasingError",
    "LethalTrifectaError",
    # refused: the gate
    "GateRefusedError",
    "GateUnknownError",
]


class GrantFormatError(BadInputError):
    """Sealed-grant bytes are not a canonical Charter grant."""


class InvalidRequestError(InvalidModelError):
    """A request type (``SpawnIntent``, ``RequestedGrant``) was built from bad values
    (the same one-line message as every public model's, see ``InvalidModelError``)."""


class AgentExistsError(StateError):
    """A durable agent of that name is already in the directory."""


class UnknownAgentError(StateError):
    """No durable agent of that name is in the directory."""


class AuthorityRefusedError(RefusedError, abstract=True):
    """Base of every authority refusal; ``reason`` is the code journaled with it."""

    reason: ClassVar[str] = "refused"


class CustodyKeyMismatchError(AuthorityRefusedError):
    """The custody key loaded for a parent is not the key its grant or trust root names."""

    reason = "custody-key-mismatch"


class GrantSignatureInvalidError(AuthorityRefusedError):
    """A grant's signature does not verify under its issuer's key (forged or altered)."""

    reason = "grant-signature-invalid"


class GrantChainBrokenError(AuthorityRefusedError):
    """A chain of grants does not link: wrong issuer, lineage, digest, or a widened link."""

    reason = "grant-chain-broken"


class ForeignRootError(AuthorityRefusedError):
    """A chain of grants starts at a root other than the one it claims."""

    reason = "foreign-root"


class GrantNotJournaledError(AuthorityRefusedError):
    """A caller presented a grant the journal never committed."""

    reason = "grant-not-journaled"


class GrantExpiredError(AuthorityRefusedError):
    """The caller's grant has expired; an expired grant cannot spawn."""

    reason = "grant-expired"


class LineageRevokedError(AuthorityRefusedError):
    """The caller, or an ancestor of it, was revoked: nothing below a revoked lineage
    may spawn, be admitted or start."""

    reason = "revoked"


class UnknownParentError(AuthorityRefusedError):
    """The caller's root is not a durable agent in the directory."""

    reason = "unknown-parent"


class DepthExhaustedError(AuthorityRefusedError):
    """The parent has depth 0 remaining: it may not spawn at all."""

    reason = "depth-exhausted"


class FanoutExhaustedError(AuthorityRefusedError):
    """The fan-out is wider than the parent's remaining fan-out."""

    reason = "fanout-exhausted"


class InvariantViolationError(AuthorityRefusedError, abstract=True):
    """A minted child would not lie within its parent; the mint is refused."""

    reason = "invariant"


class DepthNotDecreasingError(InvariantViolationError):
    """A child's depth remaining is not strictly below its parent's."""

    reason = "invariant-depth-not-decreasing"


class AxisWidenedError(InvariantViolationError):
    """A child's set or ceiling axis (tools, egress, secrets, budget, expiry) is wider."""

    reason = "invariant-axis-widened"


class ClearanceRaisedError(InvariantViolationError):
    """A child's clearance is above its parent's."""

    reason = "invariant-clearance-raised"


class PermissionModeRaisedError(InvariantViolationError):
    """A child's permission mode is more permissive than its parent's."""

    reason = "invariant-permission-mode-raised"


class FanoutNotDecreasingError(InvariantViolationError):
    """A child's fan-out remaining is not strictly below its parent's remaining fan-out."""

    reason = "invariant-fanout-not-decreasing"


class LethalTrifectaError(AuthorityRefusedError):
    """A minted child would hold private data, untrusted content and a way out at once
    (docs/scan.md), and the operator's policy does not name it."""

    reason = "lethal-trifecta"


class GateRefusedError(AuthorityRefusedError):
    """The net-potential-gain gate judged the fan-out negative."""

    reason = "gate-negative"


class GateUnknownError(AuthorityRefusedError):
    """The gate could not judge the fan-out (or its policy failed); fail closed."""

    reason = "gate-unknown"
