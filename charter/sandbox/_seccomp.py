"""A small seccomp-BPF compiler for one deny-list policy (no libseccomp needed).

The program checks the architecture (anything else is killed), refuses the x32 ABI,
answers EPERM for every denied system call, ENOSYS for ``clone3`` (its flags live behind
a pointer BPF cannot read, and libc falls back to ``clone``), EPERM for ``clone`` with any
namespace flag, EPERM for ``prlimit64`` with a new limit (a non-NULL third argument;
reading a limit stays allowed), EAFNOSUPPORT for ``socket`` and ``socketpair`` in any
address family but the allowed ones (AF_UNIX, AF_INET, AF_INET6), and EPERM for the
``prctl`` options that would undo the launcher's hold (PR_SET_PDEATHSIG and friends).
Everything else is allowed.
"""

from __future__ import annotations

import errno
import struct

from charter.core.errors import InternalError

__all__ = [
    "DENIED_PRCTL",
    "DENIED_SYSCALLS",
    "SOCKET_FAMILIES",
    "SUPPORTED_ARCHES",
    "compile_bpf",
    "syscall_numbers",
]

# What each denial protects: mounting and namespaces (escape the filesystem view),
# ptrace and process_vm_* (reach another process's memory), modules/kexec/bpf/perf
# (kernel attack surface), keyrings (shared with the host user), io_uring (bypasses this
# filter), userfaultfd (race amplifier), handle-based opens (escape bind mounts), clock
# and swap and reboot (host state), setrlimit (with prlimit64's setting form, below: the
# soft rlimits the launcher sets are the sandbox's caps, so they must not move, up or
# down; getrlimit and a read-only prlimit64 stay allowed). The i386 forms (ugetrlimit,
# the old setrlimit) need no rule: a non-x86_64 architecture is killed outright.
DENIED_SYSCALLS: tuple[str, ...] = (
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "fsopen", "fsconfig", "fsmount", "move_mount", "open_tree", "fspick", "mount_setattr",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
    "swapon", "swapoff", "reboot", "acct", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "syslog", "quotactl", "ioperm", "iopl", "vhangup",
    "setrlimit",
)  # fmt: skip

# The address families socket(2) and socketpair(2) may use: AF_UNIX (the brokers),
# AF_INET and AF_INET6 (inside the network namespace, only a down 'lo'). A network
# namespace does not isolate every family: AF_VSOCK reaches the hypervisor and its other
# guests, AF_NETLINK, AF_PACKET, AF_BLUETOOTH, AF_ALG and the rest are kernel attack
# surface. Any other family gets EAFNOSUPPORT, as if the kernel lacked it.
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCKET_FAMILIES: tuple[int, ...] = (AF_UNIX, AF_INET, AF_INET6)

# prctl options refused with EPERM (the option is prctl's first argument, an int).
# PR_SET_PDEATHSIG: bwrap's --die-with-parent is a parent-death signal on its processes;
# the filter is in force in bwrap's pid 1 too, so nothing inside can clear it and
# outlive a SIGKILLed launcher. PR_SET_PTRACER: lets another process ptrace the caller (Yama).
# PR_SET_MM: rewrites the caller's memory map layout (needs CAP_SYS_RESOURCE as well).
PR_SET_PDEATHSIG, PR_SET_MM, PR_SET_PTRACER = 1, 35, 0x59616D61
DENIED_PRCTL: tuple[int, ...] = (PR_SET_PDEATHSIG, PR_SET_MM, PR_SET_PTRACER)

_X86_64: dict[str, int] = {
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
    "setns": 308, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "move_mount": 429,
    "open_tree": 428, "fspick": 433, "mount_setattr": 442, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "bpf": 321, "perf_event_open": 298, "keyctl": 250,
    "add_key": 248, "request_key": 249, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "userfaultfd": 323, "open_by_handle_at": 304,
    "name_to_handle_at": 303, "lookup_dcookie": 212, "swapon": 167, "swapoff": 168,
    "reboot": 169, "acct": 163, "settimeofday": 164, "clock_settime": 227,
    "clock_adjtime": 305, "adjtimex": 159, "syslog": 103, "quotactl": 179, "ioperm": 173,
    "iopl": 172, "vhangup": 153, "setrlimit": 160, "clone": 56, "clone3": 435,
    "prlimit64": 302, "socket": 41, "socketpair": 53, "prctl": 157,
}  # fmt: skip

_ARCHES: dict[str, tuple[int, dict[str, int]]] = {"x86_64": (0xC000003E, _X86_64)}
SUPPORTED_ARCHES: tuple[str, ...] = tuple(_ARCHES)

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
_CLONE_NS_FLAGS |= 0x20000000 | 0x40000000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16
_OFF_ARG2_LO, _OFF_ARG2_HI = 32, 36  # seccomp_data.args[2], a u64, little-endian
_Insn = tuple[int, str | None, str | None, int]


def syscall_numbers(arch: str) -> dict[str, int]:
    return dict(_ARCHES[arch][1])


def compile_bpf(
    arch: str,
    denied: tuple[str, ...],
    socket_families: tuple[int, ...],
    denied_prctl: tuple[int, ...] = DENIED_PRCTL,
) -> bytes:
    """The filter as the ``struct sock_filter`` array bwrap's ``--seccomp FD`` reads.
    ``socket_families`` are the address families socket(2)/socketpair(2) may use;
    ``denied_prctl`` the prctl options refused."""
    audit_arch, table = _ARCHES[arch]
    # (code, jump-true label, jump-false label, k) or a label's name, placed where it
    # stands; jumps only go forward and are resolved below.
    prog: list[_Insn | str] = [
        (_LD_W_ABS, None, None, _OFF_ARCH),
        (_JEQ_K, None, "kill", audit_arch),
        (_LD_W_ABS, None, None, _OFF_NR),
        (_JGE_K, "eperm", None, _X32_SYSCALL_BIT),
    ]
    prog += [(_JEQ_K, "eperm", None, table[name]) for name in denied]
    prog += [
        (_JEQ_K, "socket", None, table["socket"]),
        (_JEQ_K, "socket", None, table["socketpair"]),
        (_JEQ_K, "prctl", None, table["prctl"]),
        (_JEQ_K, "enosys", None, table["clone3"]),
        (_JEQ_K, "prlimit64", None, table["prlimit64"]),
        (_JEQ_K, None, "allow", table["clone"]),
        (_LD_W_ABS, None, None, _OFF_ARG0),
        (_JSET_K, "eperm", "allow", _CLONE_NS_FLAGS),
        "prlimit64",  # prlimit64(pid, resource, new_limit, old_limit): new_limit == NULL
        (_LD_W_ABS, None, None, _OFF_ARG2_LO),
        (_JEQ_K, None, "eperm", 0),
        (_LD_W_ABS, None, None, _OFF_ARG2_HI),
        (_JEQ_K, "allow", "eperm", 0),
        # socket(domain, ...), socketpair(domain, ...): the domain is an int, so the
        # kernel reads only the low word of the argument.
        "socket",
        (_LD_W_ABS, None, None, _OFF_ARG0),
        *[(_JEQ_K, "allow", None, family) for family in socket_families],
        (_RET_K, None, None, _RET_ERRNO | errno.EAFNOSUPPORT),
        "prctl",  # prctl(option, ...): option is an int, its low word is what counts
        (_LD_W_ABS, None, None, _OFF_ARG0),
        *[(_JEQ_K, "eperm", None, option) for option in denied_prctl],
        (_RET_K, None, None, _RET_ALLOW),
        "allow",
        (_RET_K, None, None, _RET_ALLOW),
        "eperm",
        (_RET_K, None, None, _RET_ERRNO | errno.EPERM),
        "enosys",
        (_RET_K, None, None, _RET_ERRNO | errno.ENOSYS),
        "kill",
        (_RET_K, None, None, _RET_KILL_PROCESS),
    ]
    labels: dict[str, int] = {}
    insns: list[_Insn] = []
    for item in prog:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(insns):
        t = 0 if jt is None else labels[jt] - i - 1
        f = 0 if jf is None else labels[jf] - i - 1
        if not 0 <= t <= 255 or not 0 <= f <= 255:  # a u8 offset
            raise InternalError(f"seccomp instruction {i}: a jump out of BPF's forward range")
        out += struct.pack("<HBBI", code, t, f, k)
    return bytes(out)
