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
        if event["type"] == "SandboxStarted":
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
