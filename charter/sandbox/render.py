"""Pure renderers of a :class:`SandboxSpec`: bubblewrap argv, cgroup files, OCI config.

Each renderer reads only the spec (and the fd numbers the launcher chose), so each has
golden tests. Every isolation flag says what breaks without it.
"""

from __future__ import annotations

import functools
from typing import Any, assert_never

from charter.core.errors import InternalError
from charter.sandbox._seccomp import compile_bpf
from charter.sandbox.spec import SHM, TMP, CgroupMode, Namespace, SandboxSpec

__all__ = ["BwrapFds", "render_bwrap", "render_cgroup", "render_oci", "render_seccomp"]

_INIT_PROC = "/proc/1"
_PAGE = 4096


class BwrapFds:
    """The fd numbers the launcher passes to bwrap: the BPF program and one per file."""

    __slots__ = ("files", "seccomp")

    def __init__(self, seccomp: int, files: tuple[int, ...]) -> None:
        self.seccomp = seccomp
        self.files = files


def _bwrap_namespace(ns: Namespace) -> list[str]:  # noqa: PLR0911 (one return per namespace)
    match ns:
        case Namespace.USER:
            # Without it bwrap started by a real uid keeps that uid's view; with
            # --disable-userns (below) the sandbox cannot make a nested user namespace,
            # which would give it a fresh set of capabilities over new namespaces.
            return ["--unshare-user", "--disable-userns"]
        case Namespace.MOUNT:
            return []  # bwrap always makes a new mount namespace; it cannot be turned off
        case Namespace.PID:
            # Without it the sandbox sees, signals and ptraces host processes.
            return ["--unshare-pid"]
        case Namespace.NETWORK:
            # Without it the sandbox reaches the host's network and loopback listeners;
            # with it there is only a down 'lo' and the broker socket.
            return ["--unshare-net"]
        case Namespace.IPC:
            # Without it SysV shared memory and message queues are shared with the host.
            return ["--unshare-ipc"]
        case Namespace.UTS:
            # Without it the sandbox could set the host's hostname.
            return ["--unshare-uts"]
        case Namespace.CGROUP:
            # Without it /proc/self/cgroup reveals the host's cgroup layout.
            # (--unshare-all only *tries* this one, so it is named explicitly.)
            return ["--unshare-cgroup"]
        case _ as unreachable:
            assert_never(unreachable)


def _sockets(spec: SandboxSpec) -> list[tuple[str, str]]:
    """The broker sockets bound into the sandbox (source, destination): the egress
    broker's, the key broker's (the door) and the model door's, those that exist."""
    pairs = (
        (spec.egress_socket_src, spec.egress_socket_dest),
        (spec.key_socket_src, spec.key_socket_dest),
        (spec.model_socket_src, spec.model_socket_dest),
    )
    return [(src, dest) for src, dest in pairs if src is not None]


def render_bwrap(
    spec: SandboxSpec, command: list[str], fds: BwrapFds, *, bwrap: str = "bwrap"
) -> list[str]:
    """The bwrap argv (a list, never a shell string). Order matters: bwrap applies
    options in sequence, so every bind precedes ``--remount-ro /``."""
    if len(fds.files) != len(spec.files):
        raise InternalError(
            f"render_bwrap was given {len(fds.files)} file fds for {len(spec.files)} spec files"
        )
    argv = [bwrap]
    for ns in spec.namespaces:
        argv += _bwrap_namespace(ns)
    argv += [
        # Inside uid/gid; the *host* uid is set by the launcher, because bwrap started
        # by root maps the inside uid to host root (a root-only 0600 file is readable).
        "--uid", str(spec.inside_uid),
        "--gid", str(spec.inside_gid),
        "--hostname", spec.hostname,
        # Without it the caller's whole environment (tokens, HOME, SSH_AUTH_SOCK) leaks in.
        "--clearenv",
    ]  # fmt: skip
    for name, value in spec.env:
        argv += ["--setenv", name, value]
    if spec.die_with_parent:
        # Without it a sandbox outlives a SIGKILLed launcher and runs unsupervised.
        argv += ["--die-with-parent"]
    if spec.new_session:
        # Without it the sandbox shares the caller's terminal session and can push
        # keystrokes into it with the TIOCSTI ioctl.
        argv += ["--new-session"]
    # Without it bwrap (root in its namespace) would keep capabilities; the child gets
    # none, and bwrap sets PR_SET_NO_NEW_PRIVS before exec so none can be regained.
    argv += ["--cap-drop", "ALL"]
    for src, dest in spec.ro_binds:
        argv += ["--ro-bind", src, dest]
    for target, link in spec.symlinks:
        argv += ["--symlink", target, link]
    for (path, _), fd in zip(spec.files, fds.files, strict=True):
        # Made-up passwd/group/hosts: the host's accounts are not visible.
        argv += ["--ro-bind-data", str(fd), path]
    # A private /proc for the new pid namespace: host processes are not listed.
    argv += ["--proc", "/proc"]
    # bwrap's own init is pid 1 inside: same uid as the command and dumpable (bwrap 0.8
    # writes its uid map through /proc/self, which a non-dumpable process cannot), so
    # without this its /proc entry is open to the command: /proc/1/environ (bwrap's
    # environment) and /proc/1/mem, its memory, writable. An empty read-only tmpfs
    # hides it (mount and umount are refused inside).
    argv += ["--size", str(_PAGE), "--tmpfs", _INIT_PROC, "--remount-ro", _INIT_PROC]
    argv += [
        # bwrap's /dev is a tmpfs writable by the sandbox user: a second writable place.
        # It is remounted read-only after a size-capped /dev/shm is put in it.
        "--dev", "/dev",
        "--size", str(spec.shm_bytes), "--tmpfs", SHM,
        "--remount-ro", "/dev",
        # Without --size a tmpfs grows until the memory cgroup kills the sandbox.
        "--size", str(spec.tmp_bytes), "--tmpfs", TMP,
    ]  # fmt: skip
    if spec.workspace_src is None:
        # A private workspace: a size-capped tmpfs. Without --size it grows until the
        # memory cgroup kills the sandbox; on a host directory instead, writes would
        # fill the host's disk, outlive the sandbox and could leave setuid files there.
        argv += ["--size", str(spec.workspace_bytes), "--tmpfs", spec.workspace_dest]
    else:
        # The one writable bind: a persistent workspace's overlay, which the launcher
        # mounts nosuid,nodev with every write on a size-capped tmpfs (a direct bind of
        # the host directory would let writes fill its disk and leave setuid files).
        argv += ["--bind", spec.workspace_src, spec.workspace_dest]
    # The brokers' sockets. The egress broker's is the only route outward: no network
    # device but 'lo' exists inside.
    for src, dest in _sockets(spec):
        argv += ["--ro-bind", src, dest]
    argv += [
        "--chdir", spec.workspace_dest,
        # Without it the sandbox's root (a tmpfs bwrap made) is writable.
        "--remount-ro", "/",
        # Without it every system call of the kernel is reachable (mount, ptrace, bpf ...).
        "--seccomp", str(fds.seccomp),
        "--",
    ]  # fmt: skip
    return argv + list(command)


def render_cgroup(spec: SandboxSpec, mode: CgroupMode | None = None) -> dict[str, str]:
    """Limit files and values: v1 keys are ``controller/file``; v2 keys are file names."""
    chosen = spec.cgroup_mode if mode is None else mode
    match chosen:
        case CgroupMode.V1:
            # pids.max is the fork-bomb guard (bwrap's own two processes count in it);
            # memory includes tmpfs pages; memsw = memory means no swap escape.
            return {
                "pids/pids.max": str(spec.pids_max),
                "memory/memory.limit_in_bytes": str(spec.memory_bytes),
                "memory/memory.memsw.limit_in_bytes": str(spec.memsw_bytes),
                "cpu/cpu.cfs_period_us": str(spec.cpu_period_us),
                "cpu/cpu.cfs_quota_us": str(spec.cpu_quota_us),
            }
        case CgroupMode.V2:
            return {
                "pids.max": str(spec.pids_max),
                "memory.max": str(spec.memory_bytes),
                "memory.swap.max": str(spec.memsw_bytes - spec.memory_bytes),
                "cpu.max": f"{spec.cpu_quota_us} {spec.cpu_period_us}",
            }
        case _ as unreachable:
            assert_never(unreachable)


def render_seccomp(spec: SandboxSpec) -> bytes:
    """The compiled BPF program for bwrap's ``--seccomp FD``."""
    return _compiled(spec.arch, spec.seccomp_denied, spec.socket_families, spec.prctl_denied)


@functools.lru_cache(maxsize=8)
def _compiled(
    arch: str, denied: tuple[str, ...], families: tuple[int, ...], prctl: tuple[int, ...]
) -> bytes:
    return compile_bpf(arch, denied, families, prctl)


def _oci_socket_rules(families: tuple[int, ...]) -> list[dict[str, Any]]:
    """EAFNOSUPPORT for socket/socketpair in any other family. libseccomp takes one
    comparison per argument and rule, so the gaps are listed, then everything above."""
    top = max(families)
    refused = [
        {"index": 0, "value": v, "op": "SCMP_CMP_EQ"} for v in range(top) if v not in families
    ]
    refused.append({"index": 0, "value": top, "op": "SCMP_CMP_GT"})
    return [
        {"names": ["socket", "socketpair"], "action": "SCMP_ACT_ERRNO", "errnoRet": 97,
         "args": [arg]}
        for arg in refused
    ]  # fmt: skip


def _oci_namespace(ns: Namespace) -> str:  # noqa: PLR0911 (one return per namespace)
    match ns:
        case Namespace.USER:
            return "user"
        case Namespace.MOUNT:
            return "mount"
        case Namespace.PID:
            return "pid"
        case Namespace.NETWORK:
            return "network"
        case Namespace.IPC:
            return "ipc"
        case Namespace.UTS:
            return "uts"
        case Namespace.CGROUP:
            return "cgroup"
        case _ as unreachable:
            assert_never(unreachable)


def render_oci(spec: SandboxSpec, command: list[str], *, rootfs: str = "rootfs") -> dict[str, Any]:
    """An OCI runtime ``config.json`` (crun/runc) with the same properties."""
    ro = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536"]},
        {"destination": SHM, "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", f"size={spec.shm_bytes}"]},
        {"destination": TMP, "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", f"size={spec.tmp_bytes}"]},
    ]  # fmt: skip
    mounts += [
        {"destination": d, "type": "bind", "source": s, "options": ro} for s, d in spec.ro_binds
    ]
    if spec.workspace_src is None:
        mounts.append(
            {"destination": spec.workspace_dest, "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", f"size={spec.workspace_bytes}"]}
        )  # fmt: skip
    else:
        mounts.append(
            {"destination": spec.workspace_dest, "type": "bind", "source": spec.workspace_src,
             "options": ["rw", "nosuid", "nodev", "rbind", "rprivate"]}
        )  # fmt: skip
    mounts.extend(
        {"destination": dest, "type": "bind", "source": src, "options": ro}
        for src, dest in _sockets(spec)
    )
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": spec.inside_uid, "gid": spec.inside_gid},
            "args": list(command),
            "env": [f"{k}={v}" for k, v in spec.env],
            "cwd": spec.workspace_dest,
            "capabilities": {
                k: list(spec.capabilities)
                for k in ("bounding", "effective", "inheritable", "permitted", "ambient")
            },
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": spec.nofile, "soft": spec.nofile},
                {"type": "RLIMIT_NPROC", "hard": spec.nproc, "soft": spec.nproc},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
            ],
            "noNewPrivileges": spec.no_new_privs,
        },
        "root": {"path": rootfs, "readonly": True},
        "hostname": spec.hostname,
        "mounts": mounts,
        "linux": {
            "uidMappings": [{"containerID": spec.inside_uid, "hostID": spec.host_uid, "size": 1}],
            "gidMappings": [{"containerID": spec.inside_gid, "hostID": spec.host_gid, "size": 1}],
            "namespaces": [{"type": _oci_namespace(ns)} for ns in spec.namespaces],
            "resources": {
                "pids": {"limit": spec.pids_max},
                "memory": {"limit": spec.memory_bytes, "swap": spec.memsw_bytes},
                "cpu": {"quota": spec.cpu_quota_us, "period": spec.cpu_period_us},
            },
            "readonlyPaths": ["/dev", "/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "seccomp": {
                "defaultAction": "SCMP_ACT_ALLOW",
                "architectures": ["SCMP_ARCH_X86_64"],
                "syscalls": [
                    {"names": list(spec.seccomp_denied), "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
                    {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
                    # Setting a limit (a non-NULL new_limit) is refused; reading is not.
                    {
                        "names": ["prlimit64"],
                        "action": "SCMP_ACT_ERRNO",
                        "errnoRet": 1,
                        "args": [{"index": 2, "value": 0, "op": "SCMP_CMP_NE"}],
                    },
                    *_oci_socket_rules(spec.socket_families),
                    # The prctl options that would undo the launcher's hold.
                    *[
                        {
                            "names": ["prctl"],
                            "action": "SCMP_ACT_ERRNO",
                            "errnoRet": 1,
                            "args": [{"index": 0, "value": option, "op": "SCMP_CMP_EQ"}],
                        }
                        for option in spec.prctl_denied
                    ],
                ],
            },
        },
    }
