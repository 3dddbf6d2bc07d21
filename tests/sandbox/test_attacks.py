"""Attacks on a real sandbox, each beside a positive control that shows the test can pass.

Every test here runs real bubblewrap with the launcher's caps; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import Launcher, MemorySink, Outcome, SandboxLeased, SandboxStarted

from ._support import on_host, out, sandboxed

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=128MiB,egress=0MB")

WRITE = """
import sys
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        print(path, "written")
    except OSError as e:
        print(path, type(e).__name__, e.errno)
"""


def _results(text: str) -> dict[str, str]:
    return {line.split()[0]: " ".join(line.split()[1:]) for line in text.splitlines()}


def test_writes_outside_the_workspace_fail(launcher: Launcher) -> None:
    o = sandboxed(
        launcher,
        B,
        WRITE,
        "/x",
        "/usr/x",
        "/etc/x",
        "/dev/x",
        "/dev/null.x",
        "/workspace/ok",
        "/tmp/ok",
        "/dev/shm/ok",
    )
    r = _results(out(o))
    for path in ("/x", "/usr/x", "/etc/x", "/dev/x", "/dev/null.x"):
        assert r[path].startswith("OSError 30"), (path, r[path])  # EROFS
    # Positive control: the workspace and the two capped tmpfs mounts are writable.
    assert r["/workspace/ok"] == r["/tmp/ok"] == r["/dev/shm/ok"] == "written"


def test_tmp_is_capped_at_its_size(launcher: Launcher) -> None:
    fill = """
import errno, os, sys
limit = int(sys.argv[1]); n = 0
try:
    with open("/tmp/fill", "wb") as f:
        while n < 2 * limit:
            f.write(b"x" * 65536); f.flush(); n += 65536
    print("no-limit", n)
except OSError as e:
    print(errno.errorcode[e.errno], n)
"""
    tmp_bytes = 32 * 1024**2  # compile_spec: mem/4 for a 128 MiB budget
    o = sandboxed(launcher, B, fill, str(tmp_bytes))
    code, written = out(o).split()
    assert code == "ENOSPC"
    assert int(written) <= tmp_bytes
    # Control: under the cap the same write succeeds.
    o = sandboxed(launcher, B, fill.replace("2 * limit", "limit // 2"), str(tmp_bytes))
    assert out(o).split()[0] == "no-limit"


def test_root_only_host_file_is_unreadable(launcher: Launcher, scratch: Path) -> None:
    (scratch / "secret").write_text("root only\n")
    (scratch / "secret").chmod(0o600)
    (scratch / "public").write_text("anyone\n")
    (scratch / "public").chmod(0o644)
    read = """
import sys
for p in sys.argv[1:]:
    try:
        print(p, open(p).read().strip())
    except OSError as e:
        print(p, e.errno)
"""
    o = sandboxed(launcher, B, read, "/workspace/secret", "/workspace/public", workspace=scratch)
    r = _results(out(o))
    assert r["/workspace/secret"] == "13"  # EACCES: the sandbox is not host root
    assert r["/workspace/public"] == "anyone"  # control: same bind, a readable file
    assert on_host(read, str(scratch / "secret")).stdout.split()[1:] == ["root", "only"]


def test_host_environment_and_home_are_invisible(launcher: Launcher) -> None:
    os.environ["CHARTER_TEST_SECRET"] = "hunter2"
    try:
        probe = """
import os, json
seen = [p for p in ("/root", "/home", "/var", "/sys") if os.path.exists(p)]
print(json.dumps([sorted(os.environ), seen]))
"""
        o = sandboxed(launcher, B, probe)
        control = on_host(probe)
    finally:
        del os.environ["CHARTER_TEST_SECRET"]
    env, visible = __import__("json").loads(out(o))
    assert "CHARTER_TEST_SECRET" not in env
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD"}
    assert visible == []
    # Control: the same program on the host sees both.
    host_env, host_visible = __import__("json").loads(control.stdout)
    assert "CHARTER_TEST_SECRET" in host_env
    assert "/root" in host_visible


def test_host_loopback_listener_is_unreachable(launcher: Launcher) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = str(server.getsockname()[1])
        connect = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
    print("connected")
except OSError as e:
    print(type(e).__name__)
"""
        o = sandboxed(launcher, B, connect, port)
        assert out(o).strip() in ("ConnectionRefusedError", "OSError")
        assert on_host(connect, port).stdout.strip() == "connected"  # control


def test_names_do_not_resolve(launcher: Launcher) -> None:
    resolve = """
import socket, sys
try:
    socket.getaddrinfo(sys.argv[1], 443)
    print("resolved")
except OSError:
    print("failed")
"""
    assert out(sandboxed(launcher, B, resolve, "pypi.org")).strip() == "failed"
    # Control: the resolver itself works inside (the made-up /etc/hosts name resolves).
    assert out(sandboxed(launcher, B, resolve, "localhost")).strip() == "resolved"


NS_AND_MOUNT = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
what = sys.argv[1]
if what == "userns":
    rc = libc.unshare(0x10000000)
elif what == "mount":
    rc = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
print(rc, ctypes.get_errno())
"""


@pytest.mark.parametrize("what", ["userns", "mount"])
def test_no_user_namespace_and_no_mount(launcher: Launcher, what: str) -> None:
    rc, err = out(sandboxed(launcher, B, NS_AND_MOUNT, what)).split()
    assert rc == "-1"
    assert err == "1"
    # Control: an unprivileged host process can do it (unshare first, for mount).
    if what == "userns":
        control = on_host(NS_AND_MOUNT, what, user=60998)
        assert control.stdout.split()[0] == "0"
    else:
        r = subprocess.run(
            [
                "setpriv",
                "--reuid=60998",
                "--regid=60998",
                "--clear-groups",
                "unshare",
                "-Urm",
                "mount",
                "-t",
                "tmpfs",
                "none",
                "/mnt",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert r.returncode == 0, r.stderr


def test_unshare_command_is_refused(launcher: Launcher) -> None:
    o = launcher.run(B, ["/usr/bin/unshare", "-U", "true"], capture=True)
    assert o.exit_code != 0
    assert launcher.run(B, ["/usr/bin/true"]).exit_code == 0  # control


PTRACE_KILL = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
target = int(sys.argv[1])
try:
    os.kill(target, signal.SIGKILL); print("killed")
except OSError as e:
    print("kill", e.errno)
child = os.fork()
if child == 0:
    import time; time.sleep(5); os._exit(0)
rc = libc.ptrace(16, child, None, None)  # PTRACE_ATTACH to its own child
print("ptrace", rc, ctypes.get_errno())
os.kill(child, signal.SIGKILL); os.waitpid(child, 0)
"""


def test_no_ptrace_and_no_kill_of_host_processes(launcher: Launcher) -> None:
    victim = subprocess.Popen(["sleep", "60"], user=60997, group=60997, extra_groups=[])
    try:
        text = out(sandboxed(launcher, B, PTRACE_KILL, str(victim.pid)))
        assert "kill 3" in text  # ESRCH: the host's pids do not exist in the sandbox
        assert "ptrace -1 1" in text  # EPERM from seccomp, even on its own child
        assert victim.poll() is None  # still alive
        # Control: on the host an unprivileged process may ptrace its own child...
        assert (
            "ptrace 0"
            in on_host(
                PTRACE_KILL.replace("os.kill(target, signal.SIGKILL)", "os.kill(target, 0)"),
                str(victim.pid),
                user=60997,
            ).stdout
        )
    finally:
        victim.kill()
        victim.wait()


def _pids_file(sandbox_id: str, name: str) -> int:
    """A value of the sandbox's pids cgroup, read from the kernel (0 once it is gone)."""
    for path in Path("/sys/fs/cgroup/pids").rglob(f"charter-sbx-{sandbox_id}"):
        try:
            text = (path / name).read_text()
        except OSError:
            return 0
        if name == "pids.events":
            return int(text.split()[1])
        return int(text.split()[0])
    return 0


def _wait_for(condition: object, timeout: float, what: str) -> None:
    """Poll a real condition with a bounded timeout (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_fork_bomb_is_held_at_the_pids_cap(launcher: Launcher, sink: MemorySink) -> None:
    bomb_budget = Budget.parse("tokens=0,wall=4s,cpu=4s,mem=64MiB,egress=0MB")  # pids.max 16
    box: list[Outcome] = []
    t = threading.Thread(
        target=lambda: box.append(
            launcher.run(
                # The bomb runs behind the first (and only certain) fork, so the top
                # shell never needs another fork to reach its sleep (under load it
                # could lose that race to the bomb and exit 2 instead of timing out).
                bomb_budget,
                ["/bin/sh", "-c", "b(){ b | b & }; b & exec sleep 60"],
                capture=True,
            )
        )
    )
    t.start()
    try:
        _wait_for(lambda: any(isinstance(e, SandboxStarted) for e in sink.events), 10, "start")
        sid = next(e.sandbox_id for e in sink.events if isinstance(e, SandboxLeased))
        _wait_for(lambda: _pids_file(sid, "pids.events") > 0, 10, "the bomb to hit the cap")
        # Held at the cap (pids.max 16 counts bwrap's two processes) ...
        assert _pids_file(sid, "pids.max") == 16
        assert _pids_file(sid, "pids.current") <= 16
        # ... while the host still runs programs promptly.
        start = time.monotonic()
        subprocess.run(["/bin/true"], check=True, timeout=5)
        took = time.monotonic() - start
        # Generous: this VM is shared with other test suites; a bomb that escaped its
        # cap would make this take far longer (or fail to fork at all).
        assert took < 2.0, f"host /bin/true took {took:.2f} s during the bomb"
        assert _pids_file(sid, "pids.current") <= 16
    finally:
        t.join(timeout=30)
    outcome = box[0]
    assert outcome.exit_code == 124, outcome
    assert outcome.usage.pids_limit_hits > 0
    # Control: a few processes under the cap are fine.
    ok = launcher.run(bomb_budget, ["/bin/sh", "-c", "for i in 1 2 3 4; do /bin/true & done; wait"])
    assert ok.exit_code == 0
    assert ok.usage.pids_limit_hits == 0


HOG = """
import sys
chunks = []
for _ in range(int(sys.argv[1])):
    chunks.append(b"\\1" * (8 * 1024 * 1024))
print("survived", len(chunks))
"""


def test_memory_hog_is_killed_at_its_cap(launcher: Launcher) -> None:
    small = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=0MB")
    o = sandboxed(launcher, small, HOG, "32")  # 256 MiB under a 64 MiB cap
    assert o.exit_code == 137
    assert o.usage.oom_kills >= 1
    assert o.usage.memory_peak_bytes <= 64 * 1024**2
    ok = sandboxed(launcher, small, HOG, "3")  # control: 24 MiB fits
    assert ok.exit_code == 0
    assert "survived 3" in out(ok)


BUSY = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.5: pass"


def test_cpu_hog_is_held_to_its_quota(launcher: Launcher) -> None:
    slow = Budget.parse("tokens=0,wall=10s,cpu=1s,mem=64MiB,egress=0MB")  # 0.1 core
    o = sandboxed(launcher, slow, BUSY)
    assert o.exit_code == 0
    assert o.usage.cpu_ms <= 0.1 * o.usage.wall_ms + 150  # held to 10 % of a core
    fast = Budget.parse("tokens=0,wall=10s,cpu=10s,mem=64MiB,egress=0MB")  # 1 core
    ok = sandboxed(launcher, fast, BUSY)
    assert ok.usage.cpu_ms >= 0.3 * ok.usage.wall_ms  # control: the same loop burns CPU


def test_wall_clock_kills_with_124(launcher: Launcher) -> None:
    short = Budget.parse("tokens=0,wall=1s,cpu=1s,mem=64MiB,egress=0MB")
    t = time.monotonic()
    o = launcher.run(short, ["/bin/sleep", "60"])
    assert o.exit_code == 124
    assert o.how == "wall_clock"
    assert time.monotonic() - t < 10
    assert launcher.run(short, ["/bin/sleep", "0.1"]).exit_code == 0  # control


def test_exit_codes_and_signals_pass_through(launcher: Launcher) -> None:
    assert launcher.run(B, ["/bin/sh", "-c", "exit 7"]).exit_code == 7
    o = launcher.run(B, ["/bin/sh", "-c", "kill -TERM $$"])
    assert o.exit_code == 128 + 15
    assert o.how == "signalled"


RAISE_LIMITS = """
import ctypes, errno, json, resource, sys
libc = ctypes.CDLL(None, use_errno=True)
class Rlimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_uint64), ("max", ctypes.c_uint64)]
SETRLIMIT, PRLIMIT64 = 160, 302  # x86_64
def result(rc):
    return "raised" if rc == 0 else errno.errorcode[ctypes.get_errno()]
lower_first = sys.argv[1] == "lower-first"  # the host control: from the sandbox's soft limits
caps, targets = map(int, sys.argv[2:5]), map(int, sys.argv[5:8])
seen = {}
for name, soft, target in zip(("CORE", "NOFILE", "NPROC"), caps, targets):
    which = getattr(resource, "RLIMIT_" + name)
    def reset():
        if lower_first:
            resource.setrlimit(which, (soft, resource.getrlimit(which)[1]))
    reset()
    before = resource.getrlimit(which)
    read = resource.prlimit(0, which)  # prlimit64 with no new limit: a read, allowed
    up = Rlimit(target, target)  # soft and hard up to the launcher's hard limit
    soft_up = Rlimit(before[1], before[1])  # the soft limit up to the current hard one
    attempts = []
    attempts.append(result(libc.setrlimit(which, ctypes.byref(up))))  # glibc: prlimit64
    reset()
    attempts.append(result(libc.syscall(SETRLIMIT, which, ctypes.byref(soft_up))))
    reset()
    attempts.append(result(libc.syscall(
        PRLIMIT64, ctypes.c_long(0), ctypes.c_long(which), ctypes.byref(soft_up), None)))
    after = resource.getrlimit(which)
    seen[name] = {"before": list(before), "read": list(read), "attempts": attempts,
                  "after": list(after)}
print(json.dumps(seen))
"""


@pytest.mark.parametrize("path", ["cold", "warm"])
def test_hard_rlimits_cannot_be_raised(
    launcher: Launcher, scratch: Path, state_dir: Path, path: str
) -> None:
    """The launcher's rlimits are caps code inside cannot lift, on the cold path (cgroup
    v1: soft limits only, as root here cannot lower a hard limit it would have to raise
    back) and the warm pool's (soft = hard): the seccomp filter refuses every way of
    setting a limit (glibc's setrlimit, which is prlimit64; the raw setrlimit; prlimit64
    with a new limit), while reading one (getrlimit, prlimit64 without) still works."""
    import resource

    from charter.sandbox import WarmPool

    from ._support import PY

    whiches = (resource.RLIMIT_CORE, resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC)
    host_hard = [resource.getrlimit(w)[1] for w in whiches]
    # compile_spec for a 128 MiB budget: pids.max 32, so RLIMIT_NPROC 4 * 32 + 16.
    caps = {"CORE": 0, "NOFILE": 1024, "NPROC": 144}
    for hard, value in zip(host_hard, caps.values(), strict=True):
        assert hard == resource.RLIM_INFINITY or hard > value  # so there is room to raise
    args = [*map(str, caps.values()), *map(str, host_hard)]  # RLIM_INFINITY is -1 both sides
    if path == "cold":
        o = sandboxed(launcher, B, RAISE_LIMITS, "as-is", *args)
    else:
        with WarmPool(scratch, B, 1, state_dir=state_dir) as pool:
            slot = pool.lease()
            o = slot.run([PY, "-I", "-c", RAISE_LIMITS, "as-is", *args])
            pool.release(slot, refill=False)
    inside = json.loads(out(o))
    for (name, cap), hard in zip(caps.items(), host_hard, strict=True):
        seen = inside[name]
        # The cap is the soft limit; the hard one is the launcher's (cold) or the cap (warm).
        assert seen["before"] == [cap, hard if path == "cold" else cap], (name, seen)
        assert seen["read"] == seen["before"], (name, seen)
        assert seen["attempts"] == ["EPERM"] * 3, (name, seen)
        assert seen["after"] == seen["before"], (name, seen)
    # Positive control: the same program, unsandboxed as an unprivileged uid and starting
    # from the same soft limits under the host's hard ones, raises every limit every way.
    control = json.loads(on_host(RAISE_LIMITS, "lower-first", *args, user=60995).stdout)
    for (name, cap), hard in zip(caps.items(), host_hard, strict=True):
        seen = control[name]
        assert seen["before"] == [cap, hard], (name, seen)
        assert seen["attempts"] == ["raised"] * 3, (name, seen)
        assert seen["after"] == [hard, hard], (name, seen)


ENVIRONS = """
import glob, json, os, sys
seen = {}
for d in sorted(glob.glob("/proc/[0-9]*")):
    try:
        with open(d + "/environ", "rb") as f:
            seen[d] = f.read().decode(errors="replace")
    except OSError as e:
        seen[d] = "error %d" % e.errno
print(json.dumps({"self": os.getpid(), "environs": seen}), flush=True)
sys.stdin.read()  # held open until the host has looked at every process of the sandbox
"""


def _cgroup_environs(sandbox_id: str) -> dict[int, str]:
    """The host's view: /proc/PID/environ of every process in the sandbox's cgroup
    (bwrap, its pid 1 and the command)."""
    seen = {}
    for d in Path("/sys/fs/cgroup/pids").rglob(f"charter-sbx-{sandbox_id}"):
        for pid in (d / "cgroup.procs").read_text().split():
            try:
                seen[int(pid)] = Path(f"/proc/{pid}/environ").read_bytes().decode()
            except OSError:
                continue
    return seen


@pytest.mark.parametrize("path", ["cold", "warm"])
def test_no_launcher_secret_in_any_proc_environ(
    launcher: Launcher, sink: MemorySink, scratch: Path, state_dir: Path, path: str
) -> None:
    """bwrap's --clearenv clears only the command's environment: bwrap's own pid 1
    inside the sandbox (same uid, dumpable) would keep the launcher's, readable at
    /proc/1/environ. bwrap itself is started with an empty environment (and pid 1's
    /proc entry is hidden as well)."""
    from charter.sandbox import WarmPool

    from ._support import PY

    secret = "hunter2-" + os.urandom(6).hex()
    os.environ["CHARTER_TEST_SECRET"] = secret
    release_r, release_w = os.pipe()
    try:
        box: list[Outcome] = []
        if path == "cold":
            t = threading.Thread(
                target=lambda: box.append(
                    launcher.run(B, [PY, "-I", "-c", ENVIRONS], capture=True, stdin=release_r)
                )
            )
            t.start()
            _wait_for(lambda: any(isinstance(e, SandboxStarted) for e in sink.events), 10, "start")
            sid = next(e.sandbox_id for e in sink.events if isinstance(e, SandboxLeased))
            _wait_for(lambda: len(_cgroup_environs(sid)) >= 3, 10, "the sandbox's processes")
            members = _cgroup_environs(sid)
            os.close(release_w)
            release_w = -1
            t.join(timeout=30)
            o = box[0]
        else:
            with WarmPool(scratch, B, 1, state_dir=state_dir) as pool:
                slot = pool.lease()
                members = _cgroup_environs(slot.sandbox_id)  # the parked slot: bwrap, pid 1
                os.close(release_w)  # the pooled command has no stdin: it reads EOF
                release_w = -1
                o = slot.run([PY, "-I", "-c", ENVIRONS])
                pool.release(slot, refill=False)
        # Positive control: a process started on the host with the secret shows it in
        # its /proc/PID/environ, read the same way (by itself, once its exec is done).
        host_environ = subprocess.run(
            ["cat", "/proc/self/environ"], capture_output=True, check=True, timeout=30
        ).stdout.decode()
    finally:
        del os.environ["CHARTER_TEST_SECRET"]
        os.close(release_r)
        if release_w >= 0:
            os.close(release_w)
    assert secret in host_environ
    # From the host: no process of the sandbox (bwrap, its init, the command) holds it.
    assert len(members) >= 2, members
    for pid, text in members.items():
        assert secret not in text, (pid, text)
        assert "CHARTER_TEST_SECRET" not in text, (pid, text)
    # From inside: no /proc/*/environ shows it; pid 1's (bwrap's init) is hidden.
    report = json.loads(out(o))
    environs: dict[str, str] = report["environs"]
    assert environs.get("/proc/1") in ("", "error 2"), environs
    for proc, text in environs.items():
        assert secret not in text, (proc, text)
        assert "CHARTER_TEST_SECRET" not in text, (proc, text)
    # Control inside: the same read shows the command's own, spec-defined environment.
    own = environs[f"/proc/{report['self']}"]
    assert "PATH=/usr/local/bin:/usr/bin:/bin\0" in own
    assert "HOME=/workspace\0" in own


SOCKETS = """
import json, os, socket
def attempt(make):
    try:
        make().close()
        return "allowed"
    except OSError as e:
        return e.errno
def pair(af, kind):
    a, b = socket.socketpair(af, kind)
    b.close()
    return a
seen = {
    "vsock": attempt(lambda: socket.socket(40, socket.SOCK_STREAM)),  # AF_VSOCK
    "netlink": attempt(lambda: socket.socket(16, socket.SOCK_RAW, 0)),  # AF_NETLINK, ROUTE
    "packet": attempt(lambda: socket.socket(17, socket.SOCK_RAW, 0)),  # AF_PACKET
    "netlink_pair": attempt(lambda: pair(16, socket.SOCK_RAW)),
    "unix": attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)),
    "unix_pair": attempt(lambda: pair(socket.AF_UNIX, socket.SOCK_STREAM)),
    "inet": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
    "inet6": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM)),
}
print(json.dumps(seen))
"""
EAFNOSUPPORT = 97


def test_only_unix_and_inet_sockets_can_be_made(launcher: Launcher) -> None:
    """A network namespace does not isolate every address family: AF_VSOCK reaches the
    hypervisor, AF_NETLINK and AF_PACKET are kernel surface. The seccomp filter allows
    socket/socketpair in AF_UNIX, AF_INET and AF_INET6 only."""
    host = json.loads(on_host(SOCKETS).stdout)  # root, outside any sandbox
    inside = json.loads(out(sandboxed(launcher, B, SOCKETS)))
    for family in ("vsock", "netlink", "packet", "netlink_pair"):
        assert inside[family] == EAFNOSUPPORT, (family, inside)
    # Positive control inside: the allowed families still work.
    assert inside["unix"] == inside["unix_pair"] == inside["inet"] == "allowed", inside
    if host["inet6"] == "allowed":  # only when the host kernel has IPv6 at all
        assert inside["inet6"] == "allowed", inside
    # Positive control outside: the host makes the refused families, or refuses them
    # for its own reason, never with the sandbox's errno.
    if host["vsock"] == EAFNOSUPPORT:
        pytest.skip("this kernel has no AF_VSOCK, so the control cannot show the attack")
    assert host["vsock"] == host["netlink"] == host["packet"] == "allowed", host
    assert host["netlink_pair"] != EAFNOSUPPORT, host  # EOPNOTSUPP: netlink has no pairs
    unprivileged = json.loads(on_host(SOCKETS, user=60994).stdout)
    assert unprivileged["vsock"] == unprivileged["netlink"] == "allowed", unprivileged


OUTPUT_BOMB = """
import os, sys
size, written = int(sys.argv[1]), int(sys.argv[2])
os.write(1, b"head\\n")
if size:
    os.ftruncate(1, size)  # the capture is a memfd: a sparse giant costs the sandbox nothing
os.write(2, b"e" * written)
"""


@pytest.mark.parametrize("path", ["cold", "warm"])
def test_captured_output_is_read_back_bounded(
    launcher: Launcher, scratch: Path, state_dir: Path, path: str
) -> None:
    """A sandbox can ftruncate its captured stdout (a memfd) to any size, or write more
    than anyone wants: the parent reads back at most MAX_OUTPUT_BYTES of each stream and
    says it cut them, so its own memory stays bounded."""
    import resource

    from charter.sandbox import WarmPool
    from charter.sandbox._launch import MAX_OUTPUT_BYTES

    from ._support import PY

    def run(*args: str) -> Outcome:
        if path == "cold":
            return sandboxed(launcher, B, OUTPUT_BOMB, *args)
        with WarmPool(scratch, B, 1, state_dir=state_dir) as pool:
            slot = pool.lease()
            o = slot.run([PY, "-I", "-c", OUTPUT_BOMB, *args])
            pool.release(slot, refill=False)
            return o

    huge = 1 << 30  # 1 GiB of stdout, and stderr 2 MiB past the cap
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, a high-water mark
    o = run(str(huge), str(MAX_OUTPUT_BYTES + 2 * 1024**2))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert o.exit_code == 0, o.stderr
    assert o.stdout is not None
    assert o.stderr is not None
    assert len(o.stdout) == MAX_OUTPUT_BYTES
    assert o.stdout.startswith(b"head\n")
    assert len(o.stderr) == MAX_OUTPUT_BYTES
    assert o.stdout_truncated
    assert o.stderr_truncated
    assert grown * 1024 < 64 * 1024**2, f"the parent grew by {grown} KiB reading the output"
    # Positive control: output under the cap comes back whole and is not marked cut.
    ok = run("0", str(1024**2))
    assert ok.stdout == b"head\n"
    assert ok.stderr == b"e" * 1024**2
    assert not ok.stdout_truncated
    assert not ok.stderr_truncated


def test_the_output_cap_is_the_callers(launcher: Launcher) -> None:
    o = launcher.run(B, ["/bin/echo", "0123456789abcdef"], capture=True, max_output_bytes=10)
    assert o.stdout == b"0123456789"
    assert o.stdout_truncated
    assert o.stderr == b""
    assert not o.stderr_truncated
    whole = launcher.run(B, ["/bin/echo", "0123456789abcdef"], capture=True)  # control
    assert whole.stdout == b"0123456789abcdef\n"
    assert not whole.stdout_truncated


PDEATHSIG = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
def prctl(option, arg):
    rc = libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
    return [rc, ctypes.get_errno() if rc else 0]
seen = {"set_pdeathsig_0": prctl(1, 0), "set_pdeathsig_kill": prctl(1, 9),
        "set_ptracer_any": prctl(0x59616D61, (1 << 64) - 1),
        "set_name": [libc.prctl(15, b"renamed", 0, 0, 0), 0]}
sig = ctypes.c_int(-1)
libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG: reading stays allowed
seen["pdeathsig_after"] = sig.value
print(json.dumps(seen))
"""


def test_parent_death_signal_cannot_be_cleared(launcher: Launcher) -> None:
    """--die-with-parent is a parent-death signal; prctl(PR_SET_PDEATHSIG, 0) from inside
    (or from code written into bwrap's pid 1, under the same filter) would let the
    sandbox outlive a SIGKILLed launcher. The seccomp filter refuses it (EPERM)."""
    inside = json.loads(out(sandboxed(launcher, B, PDEATHSIG)))
    assert inside["set_pdeathsig_0"] == [-1, 1], inside
    assert inside["set_pdeathsig_kill"] == [-1, 1], inside
    assert inside["set_ptracer_any"] == [-1, 1], inside
    assert inside["set_name"] == [0, 0], inside  # control: other options still work
    # Positive control: an unprivileged host process sets and clears its own.
    host = json.loads(on_host(PDEATHSIG, user=60993).stdout)
    assert host["set_pdeathsig_0"] == host["set_pdeathsig_kill"] == [0, 0], host
    assert host["pdeathsig_after"] == 9, host


INIT_MEM = """
import json, os
def attempt(path, mode):
    try:
        with open(path, mode):
            return "opened"
    except OSError as e:
        return e.errno
os.kill(1, 0)  # pid 1 (bwrap's init) is there: only its /proc entry is hidden
print(json.dumps({"init_mem": attempt("/proc/1/mem", "r+b"),
                  "init_environ": attempt("/proc/1/environ", "rb"),
                  "own_mem": attempt("/proc/self/mem", "r+b"),
                  "pid1_listed": "1" in os.listdir("/proc")}))
"""


def test_bwraps_init_memory_is_out_of_reach(launcher: Launcher) -> None:
    """bwrap's pid 1 runs as the command's uid and is dumpable (bwrap 0.8 cannot make
    it otherwise), so /proc/1/mem would let the command rewrite its memory. Its /proc
    entry is hidden under an empty read-only tmpfs."""
    seen = json.loads(out(sandboxed(launcher, B, INIT_MEM)))
    assert seen["init_mem"] == seen["init_environ"] == 2, seen  # ENOENT
    # Control: the same open of a process's memory works (its own), and procfs still
    # lists pid 1: without the tmpfs the open would reach it.
    assert seen["own_mem"] == "opened", seen
    assert seen["pid1_listed"] is True, seen
