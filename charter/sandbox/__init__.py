"""charter.sandbox: the pure spec compiler and renderers, the bubblewrap launcher, the
warm pool, the egress and key brokers, and the fail-closed host probe."""

from charter.ledger.lifecycle import (
    EgressAttempted,
    SandboxDiscarded,
    SandboxExited,
    SandboxLeased,
    SandboxProbeRefused,
    SandboxQuarantined,
    SandboxStarted,
    SandboxUsage,
)
from charter.sandbox.egress import EgressBroker, EgressGrant
from charter.sandbox.errors import (
    HostCannotIsolateError,
    KeyHandleError,
    PoolExhaustedError,
    SandboxBudgetError,
    SandboxUnavailableError,
    SlotStateError,
    UidPoolExhaustedError,
)
from charter.sandbox.keys import KeyBroker, framed, verify_signature
from charter.sandbox.launcher import EventSink, Launcher, MemorySink, Outcome
from charter.sandbox.pool import Slot, WarmPool
from charter.sandbox.probe import ProbeCheck, ProbeReport, probe, require_isolation
from charter.sandbox.render import BwrapFds, render_bwrap, render_cgroup, render_oci, render_seccomp
from charter.sandbox.spec import CgroupMode, HostFacts, Namespace, SandboxSpec, compile_spec

__all__ = [
    # the pure side
    "CgroupMode",
    "HostFacts",
    "Namespace",
    "SandboxSpec",
    "compile_spec",
    "BwrapFds",
    "render_bwrap",
    "render_cgroup",
    "render_oci",
    "render_seccomp",
    # running sandboxes
    "EventSink",
    "MemorySink",
    "Launcher",
    "Outcome",
    "Slot",
    "WarmPool",
    # brokers
    "EgressBroker",
    "EgressGrant",
    "KeyBroker",
    "framed",
    "verify_signature",
    # fail closed
    "ProbeCheck",
    "ProbeReport",
    "probe",
    "require_isolation",
    # lifecycle events
    "EgressAttempted",
    "SandboxDiscarded",
    "SandboxExited",
    "SandboxLeased",
    "SandboxProbeRefused",
    "SandboxQuarantined",
    "SandboxStarted",
    "SandboxUsage",
    # errors
    "HostCannotIsolateError",
    "KeyHandleError",
    "PoolExhaustedError",
    "SandboxBudgetError",
    "SandboxUnavailableError",
    "SlotStateError",
    "UidPoolExhaustedError",
]
