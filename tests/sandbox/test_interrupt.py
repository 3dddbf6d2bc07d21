"""Ctrl-C at ``charter sandbox run``: the sandbox is killed, its end journaled, exit 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from charter.core import Budget
from charter.core.events import Event
from charter.ledger import Journal
from charter.sandbox import Launcher, MemorySink, WarmPool
from tests.invariants import check_history, journal_history

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
TYPES = ("SandboxLeased", "SandboxStarted", "SandboxExited", "SandboxDiscarded")


def _charter(env: dict[str, str], *args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "charter", *args], text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw,  # type: ignore[call-overload]
    )  # fmt: skip


def _lifecycle(url: str) -> list[tuple[str, object]]:
    """The lifecycle of the sandbox running ``sleep`` (not of the gate's probe canary,
    which is journaled too)."""
    with Journal.open(url) as journal:
        entries = [(e.type_name, e.event) for e in journal.entries(types=TYPES)]
    ours = {
        e.sandbox_id  # type: ignore[attr-defined]
        for name, e in entries
        if name == "SandboxStarted" and e.command[0] == "/bin/sleep"  # type: ignore[attr-defined]
    }
    return [(n, e) for n, e in entries if e.sandbox_id in ours]  # type: ignore[attr-defined]


def _uid_alive(uid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].startswith("Z"):
                return True
    return False


@pytest.fixture
def env(tmp_path: Path, state_dir: Path) -> dict[str, str]:
    env = {
        "CHARTER_HOME": str(tmp_path / "home"),
        "CHARTER_DB": f"sqlite:///{tmp_path}/journal.db",
        "CHARTER_SANDBOX_STATE": str(state_dir),
    }
    init = _charter(env, "init")
    assert init.wait(60) == 0, init.communicate()
    return env


def _started(url: str, proc: subprocess.Popen[str]) -> list[tuple[str, object]]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = _lifecycle(url)
        if any(name == "SandboxStarted" for name, _ in seen):
            return seen
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the sandbox never started")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_kills_the_sandbox_journals_its_end_and_exits_130(
    env: dict[str, str], signum: int
) -> None:
    url = env["CHARTER_DB"]
    run = _charter(env, "sandbox", "run", "--", "/bin/sleep", "300")
    seen = _started(url, run)
    uid = next(e.host_uid for name, e in seen if name == "SandboxLeased")  # type: ignore[attr-defined]
    assert _uid_alive(uid)  # the sandbox runs
    run.send_signal(signum)
    _, err = run.communicate(timeout=60)
    if signum == signal.SIGTERM:
        # Control: a launcher killed without the interrupt path leaves the start open.
        assert run.returncode == -signal.SIGTERM
        names = [name for name, _ in _lifecycle(url)]
        assert names == ["SandboxLeased", "SandboxStarted"]
        return
    assert run.returncode == 130, err
    assert "Traceback" not in err
    names = [name for name, _ in _lifecycle(url)]
    assert names == list(TYPES)
    exited = next(e for name, e in _lifecycle(url) if name == "SandboxExited")
    assert exited.how == "interrupted"  # type: ignore[attr-defined]
    assert exited.exit_code == 130  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while _uid_alive(uid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _uid_alive(uid)  # nothing of the sandbox runs on
    with Journal.open(url) as journal:
        history = journal_history(journal)
    assert check_history(history).problems == []
    assert dangling_leases(history) == set()  # every sandbox lease, the canary's too, ended


def dangling_leases(history: list[tuple[int, str, dict[str, object], object]]) -> set[str]:
    """Sandboxes leased with no SandboxDiscarded or SandboxQuarantined after the lease
    (an independent fold over the whole journal, by type name and payload)."""
    open_: set[str] = set()
    for _, name, payload, _ in history:
        sandbox = str(payload.get("sandbox_id"))
        if name.startswith("SandboxLeased"):
            open_.add(sandbox)
        elif name.startswith(("SandboxDiscarded", "SandboxQuarantined")):
            open_.discard(sandbox)
    return open_


WARM = """
import json, sys
from pathlib import Path
from charter.core.budget import Budget
from charter.sandbox import WarmPool

class Printer:
    def append(self, events):
        for e in events:
            print(json.dumps({"type": type(e).type_name, **e.model_dump(mode="json")}), flush=True)

pool = WarmPool(Path(sys.argv[2]), Budget.parse("tokens=0,wall=120s,cpu=60s,mem=64MiB,egress=0MB"),
                capacity=1, sink=Printer(), state_dir=Path(sys.argv[1]))
pool.fill()
slot = pool.lease()
try:
    slot.run(["/bin/sleep", "300"])
except KeyboardInterrupt:
    pool.release(slot, refill=False)
    pool.close()
    sys.exit(130)
"""


def test_ctrl_c_in_a_warm_slot_journals_its_end(state_dir: Path, scratch: Path) -> None:
    import json

    template = scratch / "template"
    template.mkdir(mode=0o755)
    child = subprocess.Popen(
        [sys.executable, "-c", WARM, str(state_dir), str(template)], stdout=subprocess.PIPE,
        text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert child.stdout is not None
    events: list[dict[str, object]] = []
    for line in child.stdout:
        event = json.loads(line)
        events.append(event)
        if event["type"] == "SandboxStarted" and event["command"] == ["/bin/sleep", "300"]:
            break
    sandbox_id = events[-1]["sandbox_id"]
    uid = next(e["host_uid"] for e in events if e.get("sandbox_id") == sandbox_id
               and e["type"] == "SandboxLeased")  # fmt: skip
    assert _uid_alive(int(uid))  # type: ignore[call-overload]
    child.send_signal(signal.SIGINT)
    rest, _ = child.communicate(timeout=60)
    assert child.returncode == 130
    events += [json.loads(line) for line in rest.splitlines()]
    mine = [e for e in events if e.get("sandbox_id") == sandbox_id]
    assert [e["type"] for e in mine] == list(TYPES)
    assert (mine[2]["how"], mine[2]["exit_code"]) == ("interrupted", 130)
    assert not _uid_alive(int(uid))  # type: ignore[call-overload]


class _InterruptingSink(MemorySink):
    """A journal that is Ctrl-C'd while it records a sandbox's start: the interrupt
    lands between the start and the wait, where its end used to be lost."""

    def append(self, events: Sequence[Event]) -> object:
        done = super().append(events)
        if any(type(e).type_name == "SandboxStarted" for e in events):
            os.kill(os.getpid(), signal.SIGINT)
        return done


def _ends(events: list[Event]) -> list[tuple[str, object]]:
    names = ("SandboxStarted", "SandboxExited", "SandboxDiscarded")
    return [
        (type(e).type_name, getattr(e, "how", None))
        for e in events
        if type(e).type_name in names and getattr(e, "command", ("/bin/sleep",))[0] != "/bin/true"
    ]


def _run_sleep(sink: MemorySink, state_dir: Path, scratch: Path, *, warm: bool) -> None:
    budget = Budget.parse("tokens=0,wall=60s,cpu=20s,mem=128MiB,egress=0MB")
    if not warm:
        Launcher(sink, state_dir=state_dir).run(budget, ["/bin/sleep", "300"])
        return
    template = scratch / "template"
    template.mkdir(mode=0o755)
    pool = WarmPool(template, budget, capacity=1, sink=sink, state_dir=state_dir)
    try:
        pool.fill()
        slot = pool.lease()
        try:
            slot.run(["/bin/sleep", "300"])
        finally:
            pool.release(slot, refill=False)
    finally:
        pool.close()


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_ctrl_c_while_the_start_is_journaled_still_journals_the_end(
    state_dir: Path, scratch: Path, warm: bool
) -> None:
    """The interrupt is held from the start's append until the wait, which kills the
    sandbox and journals SandboxExited (interrupted) before the interrupt goes on.
    Deterministic: the journal itself raises SIGINT while recording the start."""
    sink = _InterruptingSink()
    with pytest.raises(KeyboardInterrupt):
        _run_sleep(sink, state_dir, scratch, warm=warm)
    ends = _ends(sink.events)
    assert ends[:2] == [("SandboxStarted", None), ("SandboxExited", "interrupted")], ends
    assert ("SandboxDiscarded", None) in ends
