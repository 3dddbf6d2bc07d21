"""Authority: lineage, the directory, sealed grants, intents, the gate, and minting.

A fan-out goes: caller's holdings → resolve the parent (server side) → the gate, once →
mint ``width`` children as ``requested ∩ parent`` with every invariant checked → one
journal append → grants handed out. See docs/authority.md.
"""

from charter.ledger.authority._axes import (
    Clearance,
    PermissionMode,
    covers,
    egress_meet,
    egress_within,
)
from charter.ledger.authority._decide import (
    AttenuateFn,
    FanoutCommand,
    FanoutDecision,
    MintedChild,
    ParentState,
    decide,
)
from charter.ledger.authority._events import AgentRegistered, GateDecided, GrantMinted, SpawnRefused
from charter.ledger.authority._gate import (
    CostBenefitPolicy,
    FixedPolicy,
    GateDecision,
    GatePolicy,
    GateQuestion,
    Verdict,
    ask_gate,
)
from charter.ledger.authority._grant import (
    MAX_FANOUT,
    Grant,
    GrantTerms,
    attenuate,
    check_invariants,
)
from charter.ledger.authority._intent import RequestedGrant, SpawnIntent, spawn_tool_definition
from charter.ledger.authority._lineage import MAX_LINEAGE_DEPTH, Lineage
from charter.ledger.authority._seal import (
    SealedGrant,
    Signer,
    check_custody,
    derive_child_seed,
    seal,
    verify_chain,
)
from charter.ledger.authority._service import (
    AuthorityService,
    Caller,
    Ceiling,
    Extension,
    SpawnResult,
    custody_key_name,
    register_root,
)
from charter.ledger.authority._view import AgentRecord, AuthorityView

__all__ = [
    "MAX_FANOUT",
    "MAX_LINEAGE_DEPTH",
    # lineage and axes
    "Lineage",
    "Clearance",
    "PermissionMode",
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
    "verify_chain",
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
    # events
    "AgentRegistered",
    "GrantMinted",
    "GateDecided",
    "SpawnRefused",
    # directory and service
    "AgentRecord",
    "AuthorityView",
    "AuthorityService",
    "Caller",
    "Ceiling",
    "Extension",
    "SpawnResult",
    "custody_key_name",
    "register_root",
]
