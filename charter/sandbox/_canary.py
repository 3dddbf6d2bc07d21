# ruff: noqa: E501  (the canary is a program in a string; its lines are kept whole)
"""The canary program run inside the probe's sandbox (by the host's /usr/bin/python3).

It tries what a sandbox must not be able to do and prints one JSON object of findings.
argv: host_port, canary_env_name, host_sid, pids_max, memory_bytes, then name=inode pairs
of the host's namespaces.
"""

CANARY = r"""
import ctypes, errno, json, os, resource, socket, subprocess, sys
port, env_name, host_sid, pids_max, memory = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
host_ns = dict(a.split("=", 1) for a in sys.argv[6:])
out = {}
def attempt(fn):
    try:
        fn()
        return "allowed"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def write(path):
    with open(path, "w") as f:
        f.write("x")
out["uid"] = os.getuid()
out["write"] = {p: attempt(lambda p=p: write(p)) for p in ("/x", "/usr/x", "/etc/x", "/dev/x", "/proc/x", "/workspace/canary", "/tmp/x", "/dev/shm/x")}
vfs = os.statvfs("/tmp"); out["tmp_bytes"] = vfs.f_blocks * vfs.f_frsize
vfs = os.statvfs("/dev/shm"); out["shm_bytes"] = vfs.f_blocks * vfs.f_frsize
out["read_secret"] = attempt(lambda: open("/workspace/secret").read())
out["read_public"] = attempt(lambda: open("/workspace/public").read())
out["env"] = sorted(os.environ)
out["env_canary"] = env_name in os.environ
def environs():  # every process's initial environment, bwrap's own pid 1 included
    found = {}
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                found[pid] = env_name.encode() in f.read()
        except OSError as e:
            found[pid] = errno.errorcode.get(e.errno, str(e.errno))
    return found
seen = environs()
def init_mem():
    with open("/proc/1/mem", "r+b"):
        pass
out["init_mem"] = attempt(init_mem)
out["environ_pids"] = sorted(seen, key=int)
out["environ_canary"] = [pid for pid, hit in seen.items() if hit is True]
out["terminal_fds"] = [fd for fd in (0, 1, 2) if os.isatty(fd)]
out["workspace_opts"] = next((m.split()[3] for m in open("/proc/self/mounts").read().splitlines() if m.split()[1] == "/workspace"), "")
out["home_visible"] = [p for p in ("/root", "/home", "/var", "/run/user", "/sys") if os.path.exists(p)]
def tcp():
    s = socket.create_connection(("127.0.0.1", int(port)), timeout=2); s.close()
out["tcp_host_loopback"] = attempt(tcp)
# From procfs, not if_nameindex(): glibc asks netlink, an address family refused inside.
out["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
def family(af, kind):
    socket.socket(af, kind).close()
out["socket_families"] = {name: attempt(lambda af=af, kind=kind: family(af, kind)) for name, af, kind in (
    ("unix", socket.AF_UNIX, socket.SOCK_STREAM), ("inet", socket.AF_INET, socket.SOCK_STREAM),
    ("vsock", 40, socket.SOCK_STREAM), ("netlink", 16, socket.SOCK_RAW), ("packet", 17, socket.SOCK_RAW))}
def resolve():
    try:
        socket.getaddrinfo("pypi.org", 443)
    except socket.gaierror as e:
        raise OSError(errno.EHOSTUNREACH, str(e))
out["resolve"] = attempt(resolve)
libc = ctypes.CDLL(None, use_errno=True)
def call(rc):
    if rc != 0:
        raise OSError(ctypes.get_errno(), "")
out["unshare_user"] = attempt(lambda: call(libc.unshare(0x10000000)))
out["mount"] = attempt(lambda: call(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
def ptrace_child():
    child = os.fork()
    if child == 0:
        __import__("time").sleep(30)
        os._exit(0)
    try:
        call(libc.ptrace(16, child, None, None))  # PTRACE_ATTACH to its own child
    finally:
        os.kill(child, 9); os.waitpid(child, 0)
out["ptrace_attach"] = attempt(ptrace_child)
out["clear_pdeathsig"] = attempt(lambda: call(libc.prctl(1, ctypes.c_ulong(0), 0, 0, 0)))  # PR_SET_PDEATHSIG
class Rlimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_uint64), ("max", ctypes.c_uint64)]
nofile = Rlimit()
call(libc.getrlimit(resource.RLIMIT_NOFILE, ctypes.byref(nofile)))
out["nofile"] = [nofile.cur, nofile.max]
out["core_soft"] = resource.getrlimit(resource.RLIMIT_CORE)[0]
raised = Rlimit(nofile.max, nofile.max)  # the soft limit up to the hard one
out["rlimit_raise"] = attempt(lambda: call(libc.setrlimit(resource.RLIMIT_NOFILE, ctypes.byref(raised))))
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
out["no_new_privs"] = status["NoNewPrivs"].strip()
out["seccomp"] = status["Seccomp"].strip()
out["cap_eff"] = status["CapEff"].strip()
out["cap_bnd"] = status["CapBnd"].strip()
out["ns_shared"] = [n for n, ino in host_ns.items() if str(os.stat(f"/proc/self/ns/{n}").st_ino) == ino]
out["sid_differs"] = os.getsid(0) != host_sid
kids = []
try:
    for _ in range(pids_max + 8):
        pid = os.fork()
        if pid == 0:
            __import__("time").sleep(30)
            os._exit(0)
        kids.append(pid)
    out["fork_stopped_at"] = None
except OSError as e:
    out["fork_stopped_at"] = len(kids)
for pid in kids:
    os.kill(pid, 9); os.waitpid(pid, 0)
hog = subprocess.run(["/usr/bin/python3", "-c", f"b=[b'\\1' * {memory // 8} for _ in range(16)]"])
out["memory_hog_rc"] = hog.returncode
print(json.dumps(out))
"""
