"""Golden renderings (argv, cgroup files, OCI config, seccomp BPF) and their invariants.

Regenerate the golden files after an intended change with CHARTER_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from charter.core import Budget
from charter.sandbox import (
    BwrapFds,
    CgroupMode,
    HostFacts,
    compile_spec,
    render_bwrap,
    render_cgroup,
    render_oci,
    render_seccomp,
)
from charter.sandbox._seccomp import DENIED_SYSCALLS, syscall_numbers

GOLDEN = Path(__file__).with_name("golden")
BUDGET = Budget.parse("tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB")
FACTS = HostFacts(
    sandbox_id="golden",
    host_uid=60001,
    host_gid=60001,
    workspace="/srv/ws",
    egress_socket="/run/charter-sandbox/egress.sock",
    host_cpus=2,
)
SPEC = compile_spec(BUDGET, FACTS)
FDS = BwrapFds(3, (4, 5, 6))


def _golden(name: str, value: Any) -> None:
    path = GOLDEN / name
    text = json.dumps(value, indent=1, sort_keys=True) + "\n"
    if os.environ.get("CHARTER_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert json.loads(path.read_text()) == json.loads(text), f"{name} differs from its golden file"


def test_bwrap_golden() -> None:
    _golden("bwrap.json", render_bwrap(SPEC, ["/bin/sh", "-c", "echo hi"], FDS))


def test_cgroup_golden() -> None:
    _golden("cgroup_v1.json", render_cgroup(SPEC, CgroupMode.V1))
    _golden("cgroup_v2.json", render_cgroup(SPEC, CgroupMode.V2))


def test_oci_golden() -> None:
    _golden("oci.json", render_oci(SPEC, ["/bin/sh"]))


def test_seccomp_golden() -> None:
    bpf = render_seccomp(SPEC)
    _golden(
        "seccomp.json", {"instructions": len(bpf) // 8, "sha256": hashlib.sha256(bpf).hexdigest()}
    )


def test_bwrap_invariants() -> None:
    argv = render_bwrap(SPEC, ["cmd"], FDS)
    head = argv[: argv.index("--")]
    for flag in (
        "--unshare-user",
        "--disable-userns",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--clearenv",
        "--die-with-parent",
        "--new-session",
    ):
        assert flag in head
    assert head[head.index("--cap-drop") + 1] == "ALL"
    # Exactly one writable host bind: the workspace.
    binds = [head[i + 1 : i + 3] for i, a in enumerate(head) if a == "--bind"]
    assert binds == [["/srv/ws", "/workspace"]]
    # bwrap applies options in order: the root is made read-only after every mount.
    last_mount = max(
        i for i, a in enumerate(head) if a in ("--bind", "--ro-bind", "--tmpfs", "--ro-bind-data")
    )
    assert head.index("--remount-ro") < last_mount  # /dev, right after /dev/shm
    assert len(head) - 1 - head[::-1].index("--remount-ro") > last_mount  # then /
    assert head[head.index("--seccomp") + 1] == "3"
    # Every tmpfs is size-capped.
    for i, a in enumerate(head):
        if a == "--tmpfs":
            assert head[i - 2] == "--size"


def test_a_private_workspace_is_a_capped_tmpfs_and_no_host_bind() -> None:
    spec = compile_spec(BUDGET, FACTS.model_copy(update={"workspace": None}))
    head = render_bwrap(spec, ["cmd"], FDS)
    head = head[: head.index("--")]
    assert "--bind" not in head  # no writable host directory at all
    i = head.index("/workspace", head.index("--tmpfs"))
    assert head[i - 1] == "--tmpfs"
    assert head[i - 3 : i - 1] == ["--size", str(spec.workspace_bytes)]
    assert spec.workspace_bytes == BUDGET.mem_bytes // 2
    assert i < len(head) - 1 - head[::-1].index("--remount-ro")  # before / goes read-only
    oci = render_oci(spec, ["cmd"])
    ws = [m for m in oci["mounts"] if m["destination"] == "/workspace"]
    assert ws == [{"destination": "/workspace", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", f"size={spec.workspace_bytes}"]}]  # fmt: skip
    # Control: with a host workspace the one writable bind is back.
    assert ["/srv/ws", "/workspace"] in [
        head2[i + 1 : i + 3] for head2 in [render_bwrap(SPEC, ["cmd"], FDS)]
        for i, a in enumerate(head2) if a == "--bind"
    ]  # fmt: skip


def test_oci_invariants() -> None:
    config = render_oci(SPEC, ["cmd"])
    linux = config["linux"]
    assert {n["type"] for n in linux["namespaces"]} == {
        "user",
        "mount",
        "pid",
        "network",
        "ipc",
        "uts",
        "cgroup",
    }
    assert linux["uidMappings"] == [{"containerID": 1000, "hostID": 60001, "size": 1}]
    assert config["root"]["readonly"] is True
    assert config["process"]["noNewPrivileges"] is True
    assert all(v == [] for v in config["process"]["capabilities"].values())
    assert "/dev" in linux["readonlyPaths"]
    rw = [m for m in config["mounts"] if m["type"] == "bind" and "rw" in m.get("options", [])]
    assert [m["destination"] for m in rw] == ["/workspace"]
    assert config["process"]["env"] == [f"{k}={v}" for k, v in SPEC.env]
    # socket/socketpair: every family but the allowed ones is refused with EAFNOSUPPORT.
    refused: set[int] = set()
    for rule in config["linux"]["seccomp"]["syscalls"]:
        if rule["names"] == ["socket", "socketpair"]:
            assert rule["errnoRet"] == 97
            (arg,) = rule["args"]
            if arg["op"] == "SCMP_CMP_EQ":
                refused.add(arg["value"])
            else:
                assert arg["op"] == "SCMP_CMP_GT"
                refused |= set(range(arg["value"] + 1, 64))  # AF_MAX is 46 today
    assert set(range(64)) - refused == set(SPEC.socket_families) == {1, 2, 10}


def test_seccomp_program_shape() -> None:
    """Decode the BPF: arch check first, then every denied number answers EPERM."""
    bpf = render_seccomp(SPEC)
    insns = [struct.unpack("<HBBI", bpf[i : i + 8]) for i in range(0, len(bpf), 8)]
    assert insns[0] == (0x20, 0, 0, 4)  # load arch
    assert insns[1][3] == 0xC000003E  # x86_64, else kill
    assert insns[-1] == (0x06, 0, 0, 0x80000000)  # kill process
    table = syscall_numbers("x86_64")
    checked = {k for code, _, _, k in insns if code == 0x15}
    assert {table[n] for n in DENIED_SYSCALLS} <= checked
    assert (0x06, 0, 0, 0x00050000 | 1) in insns  # ERRNO(EPERM)


def _run_bpf(bpf: bytes, nr: int, args: tuple[int, ...] = (), arch: int = 0xC000003E) -> int:
    """Evaluate the program on one ``struct seccomp_data`` (the opcodes it uses only)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    insns = [struct.unpack("<HBBI", bpf[i : i + 8]) for i in range(0, len(bpf), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:  # ret k
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


ALLOW, EPERM, ENOSYS, KILL = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000
EAFNOSUPPORT = 0x00050000 | 97


@pytest.mark.parametrize(
    ("name", "args", "action"),
    [
        ("getrlimit", (7, 0x7FFD_0000_1000), ALLOW),
        ("setrlimit", (7, 0x7FFD_0000_1000), EPERM),  # always: it can only set
        ("prlimit64", (0, 7, 0, 0x7FFD_0000_1000), ALLOW),  # a read: new_limit NULL
        ("prlimit64", (0, 7, 0x7FFD_0000_1000, 0), EPERM),  # a new limit
        ("prlimit64", (0, 7, 0x7FFD_0000_1000, 0x7FFD_0000_2000), EPERM),
        ("prlimit64", (0, 7, 1 << 32, 0), EPERM),  # a pointer whose low word is zero
        ("prlimit64", (1, 4, 0x1000, 0), EPERM),  # another process's limit
        ("clone", (0x11 | 0x01200000,), ALLOW),  # fork's flags
        ("clone", (0x10000000,), EPERM),  # CLONE_NEWUSER
        ("clone3", (), ENOSYS),
        ("mount", (), EPERM),
        ("read", (), ALLOW),
        ("socket", (1, 1, 0), ALLOW),  # AF_UNIX
        ("socket", (2, 1, 0), ALLOW),  # AF_INET
        ("socket", (10, 2, 0), ALLOW),  # AF_INET6
        ("socket", (40, 1, 0), EAFNOSUPPORT),  # AF_VSOCK
        ("socket", (16, 3, 0), EAFNOSUPPORT),  # AF_NETLINK
        ("socket", (17, 3, 0), EAFNOSUPPORT),  # AF_PACKET
        ("socket", (0, 1, 0), EAFNOSUPPORT),  # AF_UNSPEC
        ("socket", ((1 << 32) | 40, 1, 0), EAFNOSUPPORT),  # the kernel reads an int: 40
        ("socketpair", (1, 1, 0, 0x7FFD_0000_1000), ALLOW),
        ("socketpair", (16, 3, 0, 0x7FFD_0000_1000), EAFNOSUPPORT),
        ("prctl", (1, 0), EPERM),  # PR_SET_PDEATHSIG
        ("prctl", (1, 9), EPERM),
        ("prctl", (35, 1), EPERM),  # PR_SET_MM
        ("prctl", (0x59616D61, 1), EPERM),  # PR_SET_PTRACER
        ("prctl", (2, 0x7FFD_0000_1000), ALLOW),  # PR_GET_PDEATHSIG
        ("prctl", (15, 0x7FFD_0000_1000), ALLOW),  # PR_SET_NAME
        ("prctl", (38, 1), ALLOW),  # PR_SET_NO_NEW_PRIVS
    ],
)
def test_seccomp_actions(name: str, args: tuple[int, ...], action: int) -> None:
    """Run the compiled program: what each call (and each prlimit64 form) gets."""
    table = {**syscall_numbers("x86_64"), "read": 0, "getrlimit": 97}
    assert _run_bpf(render_seccomp(SPEC), table[name], args) == action


def test_seccomp_kills_other_arches_and_refuses_x32() -> None:
    bpf = render_seccomp(SPEC)
    assert _run_bpf(bpf, 75, arch=0x40000003) == KILL  # i386 (ugetrlimit is 191 there)
    assert _run_bpf(bpf, 0x40000000 | 160, (7, 0x1000)) == EPERM  # x32 setrlimit


@pytest.mark.parametrize("mode", list(CgroupMode))
def test_cgroup_values_match_spec(mode: CgroupMode) -> None:
    files = render_cgroup(SPEC, mode)
    assert str(SPEC.pids_max) in files.values()
    assert str(SPEC.memory_bytes) in files.values()
