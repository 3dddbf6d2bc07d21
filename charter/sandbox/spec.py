"""The pure spec compiler: a budget and the host facts in, exact kernel values out.

``compile_spec`` runs nothing and discovers nothing. Everything that depends on the host
(the allocated host uid, the workspace path, the broker socket, the cgroup mode, the
number of CPUs) is an input, so the same inputs always give the same spec.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from charter.core.budget import Budget
from charter.sandbox._seccomp import (
    DENIED_PRCTL,
    DENIED_SYSCALLS,
    SOCKET_FAMILIES,
    SUPPORTED_ARCHES,
)
from charter.sandbox.errors import HostFactsError, SandboxBudgetError

__all__ = [
    "CgroupMode",
    "HostFacts",
    "Namespace",
    "SandboxSpec",
    "compile_spec",
    "FIRST_SANDBOX_UID",
    "MIN_MEMORY_BYTES",
    "workspace_cap",
]

PAGE = 4096
MiB = 1024 * 1024
MIN_MEMORY_BYTES = 32 * MiB
"""Below this a sandbox cannot hold bwrap, a shell and its tmpfs pages."""
BYTES_PER_PID = 4 * MiB
"""pids.max is derived from memory: one process per 4 MiB, clamped to [16, 4096]."""
PIDS_MIN, PIDS_MAX = 16, 4096
CPU_PERIOD_US = 100_000
CPU_QUOTA_MIN_US = 1_000  # the kernel refuses cfs_quota_us below 1 ms
NOFILE = 1024
FIRST_SANDBOX_UID = 60_001
INSIDE_UID = 1000
WORKSPACE = "/workspace"
# Paths inside the sandbox (its own size-capped tmpfs mounts, never the host's).
TMP = "/tmp"  # noqa: S108
SHM = "/dev/shm"  # noqa: S108
EGRESS_SOCKET = "/run/charter/egress.sock"
KEY_SOCKET = "/run/charter/keys.sock"
MODEL_SOCKET = "/run/charter/model.sock"  # the model door (HTTP), beside the door
# The read-only view of the host: the merged-/usr layout of Debian 12. Nothing else of the
# host (no /etc beyond the loader cache, no /home, /root, /var, /run, /sys) is visible.
RO_BINDS: tuple[tuple[str, str], ...] = (
    ("/usr", "/usr"),
    ("/etc/ld.so.cache", "/etc/ld.so.cache"),
    ("/etc/alternatives", "/etc/alternatives"),
)
SYMLINKS: tuple[tuple[str, str], ...] = (
    ("usr/bin", "/bin"),
    ("usr/sbin", "/sbin"),
    ("usr/lib", "/lib"),
    ("usr/lib64", "/lib64"),
)


class Namespace(StrEnum):
    """The seven Linux namespaces; a sandbox unshares every one."""

    USER = "user"
    MOUNT = "mount"
    PID = "pid"
    NETWORK = "network"
    IPC = "ipc"
    UTS = "uts"
    CGROUP = "cgroup"


class CgroupMode(StrEnum):
    V1 = "v1"
    V2 = "v2"


class HostFacts(BaseModel):
    """What the launcher found or allocated on the host; inputs, never discovered here."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sandbox_id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    host_uid: int = Field(ge=FIRST_SANDBOX_UID, lt=2**31)
    host_gid: int = Field(ge=FIRST_SANDBOX_UID, lt=2**31)
    workspace: str | None = None
    """The host path bound at /workspace (for a persistent workspace, the overlay the
    launcher made over it); None for a private, size-capped tmpfs workspace that
    vanishes with the sandbox."""
    egress_socket: str | None = None
    key_socket: str | None = None
    model_socket: str | None = None
    cgroup_mode: CgroupMode = CgroupMode.V1
    host_cpus: int = Field(ge=1, default=1)
    arch: str = "x86_64"

    @field_validator("workspace", "egress_socket", "key_socket", "model_socket")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise HostFactsError(f"host path {value!r} must be absolute")
        return value

    @field_validator("arch")
    @classmethod
    def _arch(cls, value: str) -> str:
        if value not in SUPPORTED_ARCHES:
            raise HostFactsError(
                f"architecture {value!r} has no seccomp syscall table here "
                f"(supported: {', '.join(SUPPORTED_ARCHES)})"
            )
        return value


class SandboxSpec(BaseModel):
    """Exact kernel values for one sandbox. Every renderer reads only this."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    NAMESPACES: ClassVar[tuple[Namespace, ...]] = tuple(Namespace)

    sandbox_id: str
    namespaces: tuple[Namespace, ...]
    inside_uid: int
    inside_gid: int
    host_uid: int
    host_gid: int
    hostname: str
    env: tuple[tuple[str, str], ...]
    ro_binds: tuple[tuple[str, str], ...]
    symlinks: tuple[tuple[str, str], ...]
    files: tuple[tuple[str, str], ...]
    workspace_src: str | None
    workspace_dest: str
    workspace_bytes: int
    tmp_bytes: int
    shm_bytes: int
    egress_socket_src: str | None
    egress_socket_dest: str
    key_socket_src: str | None
    key_socket_dest: str
    model_socket_src: str | None = None
    model_socket_dest: str = MODEL_SOCKET
    pids_max: int
    memory_bytes: int
    memsw_bytes: int
    cpu_quota_us: int
    cpu_period_us: int
    wall_ms: int
    cpu_ms: int
    egress_bytes: int
    nofile: int
    nproc: int
    cgroup_mode: CgroupMode
    cgroup_name: str
    arch: str
    seccomp_denied: tuple[str, ...]
    socket_families: tuple[int, ...]
    prctl_denied: tuple[int, ...]
    no_new_privs: bool
    capabilities: tuple[str, ...]
    die_with_parent: bool
    new_session: bool


def _page_floor(n: int) -> int:
    return n - n % PAGE


def workspace_cap(budget: Budget) -> int:
    """The most a sandbox can write to its workspace, private or persistent: half its
    memory, as a tmpfs whose pages are charged to the memory cap too (so /workspace,
    /tmp and /dev/shm together never hold more than the memory)."""
    return _page_floor(_page_floor(budget.mem_bytes) // 2)


def compile_spec(budget: Budget, host: HostFacts) -> SandboxSpec:
    """Derive a sandbox's exact kernel values from its budget (pure)."""
    if budget.wall_ms <= 0:
        raise SandboxBudgetError("the budget has no wall-clock time (wall=0): nothing can run")
    if budget.cpu_ms <= 0:
        raise SandboxBudgetError("the budget has no processing time (cpu=0): nothing can run")
    if budget.mem_bytes < MIN_MEMORY_BYTES:
        raise SandboxBudgetError(
            f"the budget's memory ({budget.mem_bytes} B) is below the sandbox minimum of "
            f"{MIN_MEMORY_BYTES} B (32MiB)"
        )
    memory = _page_floor(budget.mem_bytes)
    pids = max(PIDS_MIN, min(PIDS_MAX, memory // BYTES_PER_PID))
    # The CPU rate is the budget's processing time spread over its wall clock, so a
    # sandbox that runs for its whole wall clock at its quota spends exactly its cpu_ms.
    quota = -(-budget.cpu_ms * CPU_PERIOD_US // budget.wall_ms)
    quota = max(CPU_QUOTA_MIN_US, min(quota, CPU_PERIOD_US * host.host_cpus))
    env: list[tuple[str, str]] = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", WORKSPACE),
        ("TMPDIR", TMP),
        ("LANG", "C.UTF-8"),
    ]
    if host.egress_socket is not None:
        env.append(("CHARTER_EGRESS_SOCKET", EGRESS_SOCKET))
    if host.key_socket is not None:
        env.append(("CHARTER_KEY_SOCKET", KEY_SOCKET))
    if host.model_socket is not None:
        env.append(("CHARTER_MODEL_SOCKET", MODEL_SOCKET))
    files = (
        ("/etc/passwd", f"sandbox:x:{INSIDE_UID}:{INSIDE_UID}::{WORKSPACE}:/bin/sh\n"),
        ("/etc/group", f"sandbox:x:{INSIDE_UID}:\n"),
        ("/etc/hosts", "127.0.0.1 localhost sandbox\n"),
    )
    return SandboxSpec(
        sandbox_id=host.sandbox_id,
        namespaces=SandboxSpec.NAMESPACES,
        inside_uid=INSIDE_UID,
        inside_gid=INSIDE_UID,
        host_uid=host.host_uid,
        host_gid=host.host_gid,
        hostname="sandbox",
        env=tuple(env),
        ro_binds=RO_BINDS,
        symlinks=SYMLINKS,
        files=files,
        workspace_src=host.workspace,
        workspace_dest=WORKSPACE,
        workspace_bytes=workspace_cap(budget),
        tmp_bytes=_page_floor(memory // 4),
        shm_bytes=_page_floor(memory // 16),
        egress_socket_src=host.egress_socket,
        egress_socket_dest=EGRESS_SOCKET,
        key_socket_src=host.key_socket,
        key_socket_dest=KEY_SOCKET,
        model_socket_src=host.model_socket,
        model_socket_dest=MODEL_SOCKET,
        pids_max=pids,
        memory_bytes=memory,
        memsw_bytes=memory,  # no swap: memory+swap is capped at the memory cap
        cpu_quota_us=quota,
        cpu_period_us=CPU_PERIOD_US,
        wall_ms=budget.wall_ms,
        cpu_ms=budget.cpu_ms,
        egress_bytes=budget.egress_bytes,
        nofile=NOFILE,
        # A backstop only: RLIMIT_NPROC is counted per user namespace level (bwrap nests
        # two), so set equal to pids.max it trips early and hides the cgroup cap.
        nproc=pids * 4 + 16,
        cgroup_mode=host.cgroup_mode,
        cgroup_name=f"charter-sbx-{host.sandbox_id}",
        arch=host.arch,
        seccomp_denied=DENIED_SYSCALLS,
        socket_families=SOCKET_FAMILIES,
        prctl_denied=DENIED_PRCTL,
        no_new_privs=True,
        capabilities=(),
        die_with_parent=True,
        new_session=True,
    )
