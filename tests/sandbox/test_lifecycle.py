"""Dies with its parent; the lease is journaled before the start (real journal)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from charter.core import Budget, Event
from charter.ledger import AppendFailedError, Journal
from charter.sandbox import Launcher, SandboxLeased, WarmPool

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
B = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=64MiB,egress=0MB")

# A launcher in its own process that prints each journaled event as a JSON line.
CHILD = """
import json, sys
from pathlib import Path
from charter.core.budget import Budget
from charter.sandbox import Launcher

class Printer:
    def append(self, events):
        for e in events:
            print(json.dumps({"type": type(e).type_name, **e.model_dump(mode="json")}), flush=True)

Launcher(Printer(), state_dir=Path(sys.argv[1])).run(
    Budget.parse("tokens=0,wall=120s,cpu=60s,mem=64MiB,egress=0MB"), ["/bin/sleep", "300"])
"""


def _live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _members(sandbox_id: str) -> list[int]:
    for d in Path("/sys/fs/cgroup/pids").rglob(f"charter-sbx-{sandbox_id}"):
        return [int(p) for p in (d / "cgroup.procs").read_text().split()]
    return []


def test_sandbox_dies_with_its_parent(state_dir: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(state_dir)], stdout=subprocess.PIPE, text=True,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert parent.stdout is not None
    started = None
    for line in parent.stdout:
        event = json.loads(line)
        # The gate's probe canary (journaled too) may come first: wait for the command.
        if event["type"] == "SandboxStarted" and event["command"][0] == "/bin/sleep":
            started = event
            break
    assert started is not None
    members = _members(started["sandbox_id"])
    # Control: before the kill the sandbox is alive (bwrap and the sleeping command).
    deadline = time.monotonic() + 10
    while len(members) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
        members = _members(started["sandbox_id"])
    assert len(members) >= 3
    assert all(_live(p) for p in members)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_live(p) for p in members) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(_live(p) for p in members)  # nothing of the sandbox outlived its parent
    assert _members(started["sandbox_id"]) == []
    for d in Path("/sys/fs/cgroup").glob(f"*/**/charter-sbx-{started['sandbox_id']}"):
        d.rmdir()  # the dead launcher could not remove its empty cgroups


def test_lifecycle_in_a_real_journal(tmp_path: Path, state_dir: Path, scratch: Path) -> None:
    with Journal.create(f"sqlite:///{tmp_path}/journal.db") as journal:
        outcome = Launcher(journal, state_dir=state_dir).run(B, ["/bin/sh", "-c", "exit 5"])
        entries = list(
            journal.entries(
                types=("SandboxLeased", "SandboxStarted", "SandboxExited", "SandboxDiscarded")
            )
        )
    mine = [e for e in entries if getattr(e.event, "sandbox_id", None) == outcome.sandbox_id]
    assert [e.type_name for e in mine] == [
        "SandboxLeased", "SandboxStarted", "SandboxExited", "SandboxDiscarded",
    ]  # fmt: skip
    assert mine[0].position < mine[1].position  # the lease is committed before the start
    assert mine[2].event.exit_code == 5  # type: ignore[attr-defined]


class _FailingJournal:
    """The journal's append interface, failing as a real one does: nothing written."""

    def append(self, events: list[Event]) -> object:
        raise AppendFailedError("journal append failed, nothing written")


def test_no_start_without_a_committed_lease(state_dir: Path, scratch: Path) -> None:
    scratch.chmod(0o777)
    with pytest.raises(AppendFailedError):
        Launcher(_FailingJournal(), state_dir=state_dir).run(
            B, ["/bin/sh", "-c", "touch /workspace/ran"], workspace=scratch
        )
    assert not (scratch / "ran").exists()
    # Control: with a journal that commits, the same command runs.
    from charter.sandbox import MemorySink

    Launcher(MemorySink(), state_dir=state_dir).run(
        B, ["/bin/sh", "-c", "touch /workspace/ran"], workspace=scratch
    )
    assert (scratch / "ran").exists()


def test_the_lease_names_the_worker_and_its_grant(
    tmp_path: Path, state_dir: Path, scratch: Path
) -> None:
    """SandboxLeased joins a sandbox to its worker: lineage, the lease it runs under and
    its sealed grant's digest, cold and warm, with the budget typed as it round-trips
    through a real journal."""
    worker = "agent:estate/sa-7"
    digest = hashlib.sha256(b"a sealed grant").hexdigest()
    with Journal.create(f"sqlite:///{tmp_path}/journal.db") as journal:
        cold = Launcher(journal, state_dir=state_dir).run(
            B, ["/bin/true"], lineage=worker, grant_digest=digest
        )
        with WarmPool(scratch, B, 1, sink=journal, state_dir=state_dir) as pool:
            slot = pool.lease(lineage=worker, grant_digest=digest)
            warm = slot.run(["/bin/true"])
            pool.release(slot, refill=False)
        # Control: an operator's own run names no worker.
        own = Launcher(journal, state_dir=state_dir).run(B, ["/bin/true"])
        leases = {
            e.event.sandbox_id: e.event
            for e in journal.entries(types=("SandboxLeased",))
            if isinstance(e.event, SandboxLeased)
        }
    for outcome in (cold, warm):
        lease = leases[outcome.sandbox_id]
        assert (lease.lineage, lease.lease, lease.grant_digest) == (worker, worker, digest)
        assert isinstance(lease.budget, Budget)
        assert lease.budget == B
    assert leases[warm.sandbox_id].pool == "default"
    mine = leases[own.sandbox_id]
    assert (mine.lineage, mine.lease, mine.grant_digest) == (None, None, None)
    assert mine.budget == B


def test_a_lease_journaled_before_the_join_fields_still_decodes() -> None:
    """Entries written when ``budget`` was a plain dict and the join fields did not exist
    decode under the same type name and version."""
    stored = {
        "sandbox_id": "0123456789abcdef", "host_uid": 60001, "pool": None,
        "budget": {"tokens": 0, "wall_ms": 60000, "cpu_ms": 60000,
                   "mem_bytes": 64 * 1024 * 1024, "egress_bytes": 0},
        "pids_max": 16, "memory_bytes": 64 * 1024 * 1024, "cpu_quota_us": 100000,
        "cpu_period_us": 100000, "wall_ms": 60000, "egress": [],
    }  # fmt: skip
    assert SandboxLeased.topic() == "SandboxLeased/v1"
    lease = SandboxLeased.model_validate(stored)
    assert lease.budget == B
    assert (lease.lineage, lease.lease, lease.grant_digest) == (None, None, None)
    # A digest that is not 64 lower-case hex digits is refused (control: the above).
    with pytest.raises(ValueError, match="grant_digest"):
        SandboxLeased.model_validate({**stored, "grant_digest": "not-a-digest"})


# A launcher whose sandboxes do not die with it: its bwrap drops --die-with-parent (what a
# sandbox that undid its parent-death signal would amount to). RawLauncher: no probe gate.
UNTIED_CHILD = """
import json, sys
from pathlib import Path
from charter.core.budget import Budget
from charter.sandbox._launch import RawLauncher

class Printer:
    def append(self, events):
        for e in events:
            print(json.dumps({"type": type(e).type_name, **e.model_dump(mode="json")}), flush=True)

RawLauncher(Printer(), state_dir=Path(sys.argv[1]), bwrap=sys.argv[2]).run(
    Budget.parse("tokens=0,wall=120s,cpu=60s,mem=64MiB,egress=0MB"), ["/bin/sleep", "300"])
"""

UNTIED_BWRAP = """#!/usr/bin/python3
import os, sys
os.execv("/usr/bin/bwrap", ["bwrap", *[a for a in sys.argv[1:] if a != "--die-with-parent"]])
"""


def _uid_processes(uid: int) -> list[int]:
    """Live (non-zombie) processes running as host uid ``uid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if int(fields["Uid"].split()[0]) == uid and _live(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("reaper", ["next_launcher", "next_holder_of_the_uid"])
def test_a_sandbox_outliving_its_launcher_is_reaped(
    state_dir: Path, scratch: Path, reaper: str
) -> None:
    """A SIGKILLed launcher whose sandbox survives it (its parent-death signal undone):
    the next launcher's start (reap_stale), or the next allocation of the same uid,
    kills what is left of the sandbox before anything else uses that uid."""
    from charter.sandbox._cgroup import settle
    from charter.sandbox._host import UidLease, uid_lock_dir
    from charter.sandbox._launch import RawLauncher

    untied = scratch / "bwrap-untied"
    untied.write_text(UNTIED_BWRAP)
    untied.chmod(0o755)
    parent = subprocess.Popen(
        [sys.executable, "-c", UNTIED_CHILD, str(state_dir), str(untied)],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert parent.stdout is not None
    leased = started = None
    for line in parent.stdout:
        event = json.loads(line)
        if event["type"] == "SandboxLeased":
            leased = event
        if event["type"] == "SandboxStarted":
            started = event
            break
    assert leased is not None
    assert started is not None
    uid = leased["host_uid"]
    deadline = time.monotonic() + 10
    while len(_uid_processes(uid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    # Positive control: without a reaper the sandbox outlives its launcher.
    time.sleep(0.5)
    survivors = _uid_processes(uid)
    assert len(survivors) >= 3, survivors
    lock = uid_lock_dir(state_dir) / str(uid)
    assert f"charter-sbx-{started['sandbox_id']}" in lock.read_text()
    try:
        t = time.monotonic()
        if reaper == "next_launcher":
            RawLauncher(state_dir=state_dir)  # its start reaps unsupervised sandboxes
        else:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what allocate_uid does
            with settle(UidLease(uid, fd)):
                assert _uid_processes(uid) == []  # gone before the uid is handed out
        deadline = time.monotonic() + 10
        while _uid_processes(uid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _uid_processes(uid) == [], "processes of the sandbox's uid survive"
        assert time.monotonic() - t < 10
        assert lock.read_text() == ""  # the uid is clean for its next holder
        assert _members(started["sandbox_id"]) == []
        assert not list(Path("/sys/fs/cgroup").glob(f"*/**/charter-sbx-{started['sandbox_id']}"))
    finally:
        for pid in _uid_processes(uid):
            os.kill(pid, signal.SIGKILL)
