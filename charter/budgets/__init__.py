"""Budgets, pure: leases carved out of a parent's remainder (the one lease formula the
lease book, the projections and the auditor all use), admission to cells' slots, and
the fabric ceilings. No journal, no driver: decisions return events. See
docs/projections.md for what a lease guarantees.
"""

from charter.budgets.admission import (
    ADMISSION_EVENTS,
    AdmissionRefused,
    CapInputs,
    CellConfigured,
    Cells,
    CellState,
    ResourceClass,
    SlotAdmitted,
    SlotQueued,
    SlotReleased,
    processing_cap,
)
from charter.budgets.ceilings import (
    DEFAULT_DEPTH_CEILING,
    POPULATION_STREAM,
    CeilingCheckFailedOpen,
    FabricCeilings,
    PopulationGrew,
    RegistryFacts,
    check_ceilings,
)
from charter.budgets.errors import (
    AdmissionRefusedError,
    BudgetRefusedError,
    DepthCeilingError,
    ExpiryOutOfRangeError,
    InsufficientBudgetError,
    LeaseEndedError,
    NoBudgetLedgerError,
    PopulationCeilingError,
    RenewalBeyondGrantError,
    RenewalBeyondParentError,
    SlotReleaseRacedError,
    UnknownCellError,
    UnknownLeaseError,
)
from charter.budgets.holds import HOLD_TYPES, HeldTokensCharged, HeldTokensReleased, TokensHeld
from charter.budgets.leases import (
    LEASE_EVENTS,
    MAX_EXPIRY_MS,
    BudgetLedgerOpened,
    BudgetRefused,
    BudgetSettled,
    LeaseBook,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    LedgerState,
    UsageRecorded,
    render_instant,
)

__all__ = [
    # leases
    "BudgetLedgerOpened",
    "LeaseGranted",
    "UsageRecorded",
    "LeaseReleased",
    "LeaseRenewed",
    "BudgetRefused",
    "BudgetSettled",
    "LEASE_EVENTS",
    "LeaseBook",
    "LedgerState",
    "MAX_EXPIRY_MS",
    "render_instant",
    # holds
    "HOLD_TYPES",
    "TokensHeld",
    "HeldTokensCharged",
    "HeldTokensReleased",
    # admission
    "ResourceClass",
    "CapInputs",
    "CellConfigured",
    "SlotAdmitted",
    "SlotQueued",
    "SlotReleased",
    "AdmissionRefused",
    "ADMISSION_EVENTS",
    "CellState",
    "Cells",
    "processing_cap",
    # ceilings
    "DEFAULT_DEPTH_CEILING",
    "POPULATION_STREAM",
    "CeilingCheckFailedOpen",
    "FabricCeilings",
    "PopulationGrew",
    "RegistryFacts",
    "check_ceilings",
    # errors
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
