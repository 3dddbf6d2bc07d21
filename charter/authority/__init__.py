"""The pure grant model: axes, grants, sealing, the spawn intent (the tool schema), the
gate, and ``decide`` (gate once, then mint ``width`` children as ``requested ∩ parent``
with every invariant checked). No journal and no database driver: the offline verifier
imports it. The service that resolves callers and appends is ``charter.control``.
See docs/authority.md.
"""

from charter.authority._axes import (
    Clearance,
    PermissionMode,
    SecretName,
    ToolName,
    check_secret,
    check_tool,
    covers,
    egress_meet,
    egress_within,
)
from charter.authority._decide import (
    AttenuateFn,
    FanoutCommand,
    FanoutDecision,
    MintedChild,
    ParentState,
    decide,
    refusal_event,
)
from charter.authority._gate import (
    CostBenefitPolicy,
    FixedPolicy,
    GateDecision,
    GatePolicy,
    GateQuestion,
    Verdict,
    ask_gate,
)
from charter.authority._grant import (
    Grant,
    GrantTerms,
    attenuate,
    check_invariants,
)
from charter.authority._intent import MAX_FANOUT, RequestedGrant, SpawnIntent, spawn_tool_definition
from charter.authority._seal import (
    SealedGrant,
    Signer,
    check_custody,
    derive_child_seed,
    seal,
    verify_grant_chain,
)
from charter.authority._trifecta import (
    Exposure,
    TrifectaPolicy,
    assess,
    check_trifecta,
    private_destination,
)
from charter.authority.errors import (
    AgentExistsError,
    AuthorityRefusedError,
    AxisWidenedError,
    ClearanceRaisedError,
    CustodyKeyMismatchError,
    DepthExhaustedError,
    DepthNotDecreasingError,
    FanoutExhaustedError,
    FanoutNotDecreasingError,
    ForeignRootError,
    GateRefusedError,
    GateUnknownError,
    GrantChainBrokenError,
    GrantExpiredError,
    GrantFormatError,
    GrantNotJournaledError,
    GrantSignatureInvalidError,
    InvalidRequestError,
    InvariantViolationError,
    LethalTrifectaError,
    LineageRevokedError,
    PermissionModeRaisedError,
    UnknownAgentError,
    UnknownParentError,
)
from charter.authority.events import (
    AgentRegistered,
    GateDecided,
    GrantMinted,
    LineageRevoked,
    SpawnRefused,
)

__all__ = [
    "MAX_FANOUT",
    # axes
    "Clearance",
    "PermissionMode",
    "SecretName",
    "ToolName",
    "check_secret",
    "check_tool",
    "covers",
    "egress_within",
    "egress_meet",
    # grants and sealing
    "GrantTerms",
    "Grant",
    "attenuate",
    "check_invariants",
    "SealedGrant",
    "Signer",
    "seal",
    "verify_grant_chain",
    "check_custody",
    "derive_child_seed",
    # intent and gate
    "RequestedGrant",
    "SpawnIntent",
    "spawn_tool_definition",
    "Verdict",
    "GateQuestion",
    "GateDecision",
    "GatePolicy",
    "CostBenefitPolicy",
    "FixedPolicy",
    "ask_gate",
    # decision
    "AttenuateFn",
    "ParentState",
    "FanoutCommand",
    "FanoutDecision",
    "MintedChild",
    "decide",
    "refusal_event",
    # the lethal trifecta
    "Exposure",
    "TrifectaPolicy",
    "assess",
    "check_trifecta",
    "private_destination",
    # events
    "AgentRegistered",
    "GrantMinted",
    "LineageRevoked",
    "GateDecided",
    "SpawnRefused",
    # errors
    "GrantFormatError",
    "InvalidRequestError",
    "AgentExistsError",
    "UnknownAgentError",
    "AuthorityRefusedError",
    "CustodyKeyMismatchError",
    "GrantSignatureInvalidError",
    "GrantChainBrokenError",
    "ForeignRootError",
    "GrantNotJournaledError",
    "GrantExpiredError",
    "LineageRevokedError",
    "UnknownParentError",
    "DepthExhaustedError",
    "FanoutExhaustedError",
    "InvariantViolationError",
    "DepthNotDecreasingError",
    "AxisWidenedError",
    "ClearanceRaisedError",
    "PermissionModeRaisedError",
    "LethalTrifectaError",
    "FanoutNotDecreasingError",
    "GateRefusedError",
    "GateUnknownError",
]
