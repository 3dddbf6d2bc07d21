"""Command handlers: decide on folded state, append pinned to what the decision read,
and hand out only after the commit. The spawn pipeline, the directory, budgets
(usage, release, renewal) and admission."""

from charter.control.directory import (
    DEFAULT_CEILING_TTL_S,
    AgentRecord,
    AuthorityView,
    Ceiling,
    custody_key_name,
    register_root,
)
from charter.control.resources import AdmissionService, BudgetService, ResourceView
from charter.control.spawn import (
    DEFAULT_CELL,
    Caller,
    HostLoad,
    RegistryRead,
    SpawnResult,
    SpawnService,
    host_cap_inputs,
)
from charter.control.workers import (
    WorkerScheduled,
    WorkerSpec,
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
    "ResourceView",
    "Caller",
    "HostLoad",
    "RegistryRead",
    "SpawnResult",
    "SpawnService",
    "host_cap_inputs",
    "WorkerScheduled",
    "WorkerSpec",
    "inputs_digest",
    "worker_stream",
]
