"""charter.sandbox: the pure spec compiler and renderers, the bubblewrap launcher, the
warm pool, the egress and key brokers, and the fail-closed host probe."""

from charter.sandbox._canary_watch import OVERFLOW, CanaryWatch, Decoy, DecoyTouch, plant_decoy
from charter.sandbox._digest import WorkspaceDigest, digest_workspace
from charter.sandbox._freezer import FREEZE_TIMEOUT, SandboxControl
from charter.sandbox._host import UidLease, default_state_dir, hold_uid
from charter.sandbox._peer import Member, PeerServer, Refusal, peer_uid
from charter.sandbox._signals import SandboxSignals, sample_signals, sandbox_pid, workspace_bytes
from charter.sandbox.egress import (
    WITHHELD_REASON,
    Credentials,
    DialRefusedError,
    EgressBroker,
    EgressGrant,
)
from charter.sandbox.errors import (
    HostCannotIsolateError,
    HostFactsError,
    KeyHandleError,
    KeySeedError,
    PoolCapacityError,
    PoolExhaustedError,
    SandboxBudgetError,
    SandboxUnavailableError,
    SignatureTagError,
    SlotStateError,
    UidPoolExhaustedError,
    WorkspaceRefusedError,
)
from charter.sandbox.events import (
    CredentialInjected,
    CredentialWithheld,
    EgressAttempted,
    EgressOpened,
    SandboxDiscarded,
    SandboxExited,
    SandboxLeased,
    SandboxProbeRefused,
    SandboxQuarantined,
    SandboxStarted,
    SandboxUsage,
    WorkspaceRefused,
)
from charter.sandbox.keys import KeyBroker, framed, verify_signature
from charter.sandbox.launcher import EventSink, Launcher, MemorySink, Outcome, reap_host
from charter.sandbox.pool import Slot, WarmPool
from charter.sandbox.probe import ProbeCheck, ProbeReport, probe, refuse, require_isolation
from charter.sandbox.render import BwrapFds, render_bwrap, render_cgroup, render_oci, render_seccomp
from charter.sandbox.spec import (
    FIRST_SANDBOX_UID,
    CgroupMode,
    HostFacts,
    Namespace,
    SandboxSpec,
    compile_spec,
)

__all__ = [
    # the pure side
    "FIRST_SANDBOX_UID",
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
    "reap_host",
    # supervision levers and signals
    "FREEZE_TIMEOUT",
    "SandboxControl",
    "WorkspaceDigest",
    "digest_workspace",
    "SandboxSignals",
    "sample_signals",
    "sandbox_pid",
    "workspace_bytes",
    "CanaryWatch",
    "Decoy",
    "DecoyTouch",
    "OVERFLOW",
    "plant_decoy",
    # brokers
    "DialRefusedError",
    "EgressBroker",
    "EgressGrant",
    "Credentials",
    "WITHHELD_REASON",
    "KeyBroker",
    "framed",
    "verify_signature",
    "Member",
    "PeerServer",
    "Refusal",
    "peer_uid",
    # fail closed
    "ProbeCheck",
    "ProbeReport",
    "probe",
    "require_isolation",
    "refuse",
    "default_state_dir",
    "hold_uid",
    "UidLease",
    # lifecycle events
    "EgressAttempted",
    "EgressOpened",
    "CredentialInjected",
    "CredentialWithheld",
    "SandboxDiscarded",
    "SandboxExited",
    "SandboxLeased",
    "SandboxProbeRefused",
    "SandboxQuarantined",
    "SandboxStarted",
    "SandboxUsage",
    # errors
    "HostCannotIsolateError",
    "HostFactsError",
    "KeyHandleError",
    "KeySeedError",
    "PoolCapacityError",
    "SignatureTagError",
    "PoolExhaustedError",
    "SandboxBudgetError",
    "SandboxUnavailableError",
    "SlotStateError",
    "UidPoolExhaustedError",
    "WorkspaceRefused",
    "WorkspaceRefusedError",
]
