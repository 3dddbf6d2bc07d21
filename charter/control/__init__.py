"""Command handlers: decide on folded state, append pinned to what the decision read,
and hand out only after the commit. The spawn pipeline, the directory, budgets
(usage, release, renewal) and admission, over one process's shared :class:`Views`."""

from charter.control._queue import queue_admissions
from charter.control.delegation import (
    DelegationRefused,
    DelegationReplied,
    DelegationRequested,
    DelegationView,
    OwnSandboxDeclared,
    delegation_stream,
)
from charter.control.directory import (
    DEFAULT_CEILING_TTL_S,
    AgentRecord,
    AuthorityView,
    Ceiling,
    custody_key_name,
    register_root,
)
from charter.control.errors import (
    CellSupersededError,
    DelegationRefusedError,
    NestedDelegationError,
    NoCellOfClassError,
    NotOwnSandboxError,
)
from charter.control.handler import RETRIES, Folded, Pinned, append_pinned
from charter.control.load import HostLoad, host_cap_inputs, steady_load
from charter.control.outward import OutwardCalls, OutwardIntent, OutwardOutcome
from charter.control.resources import (
    AdmissionService,
    BudgetService,
    LivePopulation,
    ResourceView,
    Shared,
)
from charter.control.revoke import revoke
from charter.control.spawn import (
    DEFAULT_CELL,
    Caller,
    RegistryRead,
    SpawnResult,
    SpawnService,
)
from charter.control.verdicts import OPERATOR_TASK_CLASS, VerdictAction, operator_verdict
from charter.control.views import Views
from charter.control.workers import (
    LIVE_STATUSES,
    Outcome,
    WorkerKilled,
    WorkerLifecycle,
    WorkerScheduled,
    WorkerSpec,
    WorkerStatus,
    check_cell_class,
    end_outcome,
    inputs_digest,
    worker_stream,
)

__all__ = [
    "DEFAULT_CELL",
    "DEFAULT_CEILING_TTL_S",
    "AgentRecord",
    "AuthorityView",
    "Ceiling",
    "custody_key_name",
    "register_root",
    "AdmissionService",
    "BudgetService",
    "LivePopulation",
    "ResourceView",
    "Shared",
    "Caller",
    "HostLoad",
    "RegistryRead",
    "SpawnResult",
    "SpawnService",
    "host_cap_inputs",
    "steady_load",
    "Views",
    "OutwardCalls",
    "OutwardIntent",
    "OutwardOutcome",
    "RETRIES",
    "Folded",
    "Pinned",
    "append_pinned",
    "queue_admissions",
    "revoke",
    "operator_verdict",
    "OPERATOR_TASK_CLASS",
    "VerdictAction",
    "CellSupersededError",
    "DelegationRefused",
    "DelegationRefusedError",
    "DelegationReplied",
    "DelegationRequested",
    "DelegationView",
    "NestedDelegationError",
    "NoCellOfClassError",
    "NotOwnSandboxError",
    "OwnSandboxDeclared",
    "delegation_stream",
    "LIVE_STATUSES",
    "Outcome",
    "check_cell_class",
    "end_outcome",
    "WorkerKilled",
    "WorkerLifecycle",
    "WorkerScheduled",
    "WorkerStatus",
    "WorkerSpec",
    "inputs_digest",
    "worker_stream",
]
