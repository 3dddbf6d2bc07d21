"""A SIGKILLed launcher, cold or warm: nothing of its sandbox outlives the reaper (no
process of the sandbox's uid, no cgroup, no broker socket, no workspace overlay or slot
directory, nothing mounted)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]

PRINTER = """
import json, sys
from pathlib import Path
from charter.core.budget import Budget

class Printer:
    def append(self, events):
        for e in events:
            print(json.dumps({"type": type(e).type_name, **e.model_dump(mode="json")}), flush=True)

state = Path(sys.argv[1])
budget = Budget.parse("tokens=0,wall=120s,cpu=60s,mem=64MiB,egress=1MB")
command = sys.argv[3:]
"""

COLD = (
    PRINTER
    + """
import os
from charter.sandbox import EgressBroker, EgressGrant, Launcher
with EgressBroker(state / f"egress-{os.getpid()}.sock") as broker:
    Launcher(Printer(), state_dir=state, egress=broker).run(
        budget, command, grant=EgressGrant(destinations=("example.com",)),
        workspace=Path(sys.argv[2]))
"""
)

WARM = (
    PRINTER
    + """
from charter.sandbox import WarmPool
pool = WarmPool(Path(sys.argv[2]), budget, capacity=1, sink=Printer(), state_dir=state)
pool.fill()
pool.lease().run(command)
"""
)

# Inside: undo what can be undone, then leave the sandbox's process tree as far as
# possible: the parent-death signal cleared (its errno is the escapee's last argument),
# a new session, a double fork whose grandchild is re-parented to the sandbox's init.
ESCAPE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0
err = 0 if rc == 0 else ctypes.get_errno()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "301", str(err)])
    os._exit(0)
os.wait()
os.execv("/bin/sleep", ["sleep", "302"])
"""


def _uid_cmdlines(uid: int) -> dict[int, list[str]]:
    """Live (non-zombie) processes of host uid ``uid`` and their argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].startswith("Z"):
            found[int(entry.name)] = [a.decode() for a in cmdline.split(b"\0") if a]
    return found


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _reap(state_dir: Path) -> dict[str, int]:
    r = subprocess.run(
        [sys.executable, "-m", "charter", "--json", "sandbox", "reap"], capture_output=True,
        text=True, timeout=120, cwd=REPO, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO), "CHARTER_SANDBOX_STATE": str(state_dir)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["cold", "warm"])
def test_a_killed_launchers_sandbox_is_gone_after_the_reaper(
    state_dir: Path, scratch: Path, kind: str
) -> None:
    template = scratch / "template"
    template.mkdir(mode=0o755)
    launcher = subprocess.Popen(
        [sys.executable, "-c", COLD if kind == "cold" else WARM, str(state_dir), str(template),
         "/usr/bin/python3", "-I", "-c", ESCAPE],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert launcher.stdout is not None
    leases, leased = {}, None
    for line in launcher.stdout:
        event = json.loads(line)
        if event["type"] == "SandboxLeased":
            leases[event["sandbox_id"]] = event
        # The gate's probe canary (journaled too) may come first: wait for the command.
        if event["type"] == "SandboxStarted" and ESCAPE in event["command"]:
            leased = leases[event["sandbox_id"]]
            break
    assert leased is not None
    uid, sandbox_id = leased["host_uid"], leased["sandbox_id"]
    try:
        # Positive control: the sandbox did all it could from inside before the kill.
        def escaped() -> bool:
            argvs = list(_uid_cmdlines(uid).values())
            return ["sleep", "301", "1"] in argvs and ["sleep", "302"] in argvs

        _wait(escaped, 20, "the escape attempts inside the sandbox")  # "1": EPERM
        socket = state_dir / f"egress-{launcher.pid}.sock"
        assert socket.exists() == (kind == "cold")
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert socket.exists() == (kind == "cold")  # a killed launcher removes nothing
        started = time.monotonic()
        _reap(state_dir)
        _wait(lambda: not _uid_cmdlines(uid), 10, "no process of the sandbox's uid")
        assert time.monotonic() - started < 10
        assert not socket.exists()
        assert not list(Path("/sys/fs/cgroup").glob(f"*/**/charter-sbx-{sandbox_id}"))
        # The slot's mount point, or the persistent workspace's overlay (its changes
        # discarded), is young: the sweep leaves it a minute, then removes it.
        leftovers = [p for p in state_dir.rglob("*") if sandbox_id in p.name]
        assert leftovers == [state_dir / ("slots" if kind == "warm" else "ws") / sandbox_id]
        os.utime(leftovers[0], (0, 0))
        _reap(state_dir)
        assert [p for p in state_dir.rglob("*") if sandbox_id in p.name] == []
        assert sandbox_id not in Path("/proc/self/mounts").read_text()  # nothing mounted
        assert (state_dir / "uids" / str(uid)).read_text() == ""  # the uid is clean
    finally:
        for pid in _uid_cmdlines(uid):
            os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
