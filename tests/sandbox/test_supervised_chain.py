"""The supervision chain on real sandboxes and a real journal, as the cell will run it
(docs/supervision.md, "The integration API"): sample -> observation -> decide -> append
the verdict -> act on the committed entry; and a decoy read -> quarantine verdict
committed -> freeze -> kill, within 1 s of the read. The cell does not run this loop yet:
these tests drive the mechanisms themselves."""

from __future__ import annotations

import hashlib
import queue
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from charter.core import Budget
from charter.core.events import Event
from charter.ledger import Journal
from charter.sandbox import (
    CanaryWatch,
    DecoyTouch,
    MemorySink,
    SandboxControl,
    SandboxSignals,
    Slot,
    WarmPool,
    plant_decoy,
    sample_signals,
)
from charter.supervision import (
    Baseline,
    CanarySet,
    CanaryTouch,
    KillVerdict,
    Observation,
    PauseVerdict,
    QuarantineVerdict,
    Signals,
    SupervisionPolicy,
    WorkerProfiled,
    canaries_for,
    decide,
    learn,
    observe,
    supervise_stream,
    touched,
)
from tests.sandbox._supervised import FORK_TO_LIMIT, Running, wait_for

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=30s,cpu=30s,mem=128MiB,egress=0MB")
POLICY = SupervisionPolicy()

HONEST = r"""
import hashlib, os
data = open("/workspace/input.bin", "rb").read()
digest = data
for _ in range(int.from_bytes(os.urandom(1), "big") % 50 + 50):
    digest = hashlib.sha256(digest + data).digest()
with open("/workspace/result.txt", "w") as f:
    f.write(digest.hex())
"""

FORKER = "import os, time\n" + FORK_TO_LIMIT + "time.sleep(30)\n"

HOARDER = r"""
import os, time
with open("/workspace/hoard.bin", "wb") as f:
    f.write(os.urandom(16 * 1024 * 1024))
fd = os.open("/workspace/counter", os.O_WRONLY | os.O_CREAT, 0o644)
i = 0
while True:
    i += 1
    os.pwrite(fd, b"%020d" % i, 0)
"""


@pytest.fixture
def pool(scratch: Path, state_dir: Path) -> Iterator[WarmPool]:
    template = scratch / "template"
    template.mkdir(mode=0o755)
    (template / "input.bin").write_bytes(hashlib.sha256(b"task").digest() * 4096)
    (template / "input.bin").chmod(0o644)
    with WarmPool(template, B, capacity=2, sink=MemorySink(), state_dir=state_dir) as p:
        yield p


def _observe(worker: Running, s: SandboxSignals) -> Observation:
    """The cell's mapping of a sandbox sample onto an observation (door counts: 0)."""
    return observe(
        lineage=worker.slot.sandbox_id, sandbox_id=worker.slot.sandbox_id, task_class="hash",
        at_ms=int(time.time() * 1000), wall_ms=int((time.monotonic() - worker.started) * 1000),
        cpu_ms=s.cpu_ms, cpu_throttled_ms=s.cpu_throttled_ms, memory_bytes=s.memory_peak_bytes,
        memory_failcnt=s.memory_failcnt, pids_limit_hits=s.pids_limit_hits,
        egress_attempts=s.egress_attempts, egress_refusals=s.egress_refusals,
        workspace_bytes=s.workspace_bytes,
    )  # fmt: skip


def _supervised_life(pool: WarmPool, code: str) -> tuple[list[Observation], Running]:
    """Run ``code`` to its end, sampled every 20 ms (and once more after it ends)."""
    worker = Running(pool, code)
    samples = []
    while not worker.done():
        samples.append(_observe(worker, sample_signals(worker.slot.spec)))
        time.sleep(0.02)  # the sampling interval
    worker.join()
    samples.append(_observe(worker, sample_signals(worker.slot.spec)))
    return samples, worker


@pytest.mark.slow
def test_honest_real_workers_get_no_verdict_and_dishonest_ones_do(pool: WarmPool) -> None:
    """A baseline learned from 20 completed real workers; 100 more of the class, every
    live sample decided: no verdict. Then a fork bomb and a hoarder of the same class
    are caught from their real samples, and the pause is carried out."""
    baseline = Baseline.empty("hash")
    for _ in range(POLICY.min_completed):
        samples, worker = _supervised_life(pool, HONEST)
        pool.release(worker.slot)
        profile = Signals()
        for sample in samples:
            profile = profile.peak(sample.signals)
        change = learn(
            baseline,
            WorkerProfiled(lineage=worker.slot.sandbox_id, task_class="hash",
                           outcome="completed", profile=profile),
        )  # fmt: skip
        assert change is not None
        baseline = Baseline.from_event(change)
    decided = 0
    for _ in range(100):
        samples, worker = _supervised_life(pool, HONEST)
        pool.release(worker.slot)
        assert worker.outcome is not None
        assert worker.outcome.exit_code == 0
        for sample in samples:
            decided += 1
            assert decide(sample, baseline, POLICY) is None, (sample, baseline)
    assert decided >= 200

    bomb = Running(pool, FORKER)
    try:
        verdict = wait_for(
            lambda: decide(_observe(bomb, sample_signals(bomb.slot.spec)), baseline, POLICY)
        )
        assert isinstance(verdict, KillVerdict)
        assert verdict.evidence[0].signal == "pids_limit_hits"
    finally:
        bomb.release()
    hoarder = Running(pool, HOARDER)
    try:
        verdict = wait_for(
            lambda: decide(_observe(hoarder, sample_signals(hoarder.slot.spec)), baseline, POLICY)
        )
        assert isinstance(verdict, PauseVerdict)
        # The workspace is a tmpfs, whose pages the memory cgroup also counts: on some
        # hosts the memory rule triggers beside the workspace's (evidence of both).
        assert "workspace_bytes" in {e.signal for e in verdict.evidence}, verdict.evidence
        SandboxControl(hoarder.slot.spec).freeze()  # the act
        stopped = hoarder.counter()
        time.sleep(0.3)  # an observation window
        assert hoarder.counter() == stopped
    finally:
        hoarder.release()


SNOOP = r"""
import os, time
found = [os.path.join(r, n) for r, _, ns in os.walk("/workspace") for n in ns if n.endswith(".ini")]
t = time.monotonic()
print(repr(t), flush=True)
open(found[0]).read()
fd = os.open("/workspace/counter", os.O_WRONLY | os.O_CREAT, 0o644)
i = 0
while True:  # what it would do next, had it not been stopped
    i += 1
    os.pwrite(fd, b"%020d" % i, 0)
"""


def test_a_decoy_read_is_a_committed_quarantine_then_a_kill_within_one_second(
    pool: WarmPool, sqlite_url: str
) -> None:
    journal = Journal.create(sqlite_url)
    touches: queue.Queue[DecoyTouch] = queue.Queue()
    acted: dict[str, float] = {}
    stop = threading.Event()
    planted: dict[str, CanarySet] = {}

    def on_touch(touch: DecoyTouch) -> None:
        """The watch's callback: the verdict is appended (committed) and nothing else."""
        canaries = planted["canaries"]
        verdict = touched(
            canaries,
            CanaryTouch(sandbox_id=touch.key, kind="credential_file",
                        value=canaries.credential_file, at_ms=0),
            lineage=touch.key, task_class="hash", policy_version=POLICY.version,
        )  # fmt: skip
        if verdict is not None and "appended" not in acted:
            journal.append([verdict], expect={supervise_stream(verdict.lineage): 0})
            acted["appended"] = time.monotonic()
        touches.put(touch)

    def follow(worker_box: list[Running]) -> None:
        """The cell's follower: acts on a committed verdict, read back from the journal."""
        start = 1
        while not stop.is_set():
            for entry in journal.entries(start=start):
                start = entry.position + 1
                if isinstance(entry.event, QuarantineVerdict) and worker_box:
                    acted["read"] = time.monotonic()
                    acted["recorded"] = entry.recorded_at.timestamp()
                    control = SandboxControl(worker_box[0].slot.spec)
                    control.freeze()
                    assert worker_box[0].slot.proc is not None
                    assert worker_box[0].slot.proc.cgroup.kill_all(timeout=1.0)
                    acted["killed"] = time.monotonic()
                    acted["killed_wall"] = datetime.now(UTC).timestamp()
            time.sleep(0.002)  # the follower's poll

    box: list[Running] = []
    follower = threading.Thread(target=follow, args=(box,), daemon=True)
    with CanaryWatch(on_touch) as watch:

        def before(slot: Slot) -> None:
            canaries = canaries_for(slot.sandbox_id, secrets.token_bytes(16))
            planted["canaries"] = canaries
            journal.append([canaries.planted(slot.sandbox_id)])
            with plant_decoy(slot.spec, canaries.credential_file, canaries.credential_text()) as d:
                watch.watch(slot.sandbox_id, d)

        follower.start()
        worker = Running(pool, SNOOP, before=before)
        box.append(worker)
        try:
            outcome = worker.join(timeout=10)
            wait_for(lambda: "killed" in acted, timeout=5)
            opened = float((outcome.stdout or b"").decode().split()[0])
            assert outcome.how == "signalled"
            assert acted["appended"] - opened < 1.0
            assert acted["killed"] - opened < 1.0, acted["killed"] - opened
            # The verdict was committed before the act: read back from the journal, its
            # commit time precedes the kill.
            assert acted["appended"] <= acted["read"] <= acted["killed"]
            assert acted["recorded"] <= acted["killed_wall"]
            events: list[Event] = [e.event for e in journal.entries()]
            (verdict,) = [e for e in events if isinstance(e, QuarantineVerdict)]
            assert verdict.evidence[0].canary is not None
            assert verdict.evidence[0].canary.startswith("credential_file:.charter-secrets/")
            print(f"\ndecoy read -> verdict committed {1000 * (acted['appended'] - opened):.1f} ms,"
                  f" -> killed {1000 * (acted['killed'] - opened):.1f} ms")  # fmt: skip
        finally:
            stop.set()
            follower.join(5)
            worker.release()
            journal.close()
