"""The host-side watch on a sandbox's decoy credential file: a worker that reads it is
seen within 1 s; an honest worker that lists, stats and writes around it is not."""

from __future__ import annotations

import os
import queue
import secrets
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import (
    OVERFLOW,
    CanaryWatch,
    Decoy,
    DecoyTouch,
    MemorySink,
    SandboxUnavailableError,
    Slot,
    WarmPool,
    plant_decoy,
    sandbox_pid,
)
from charter.supervision import (
    CanarySet,
    CanaryTouch,
    QuarantineVerdict,
    canaries_for,
    touched,
)
from tests.sandbox._supervised import Running, wait_for

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=30s,cpu=30s,mem=64MiB,egress=0MB")


@pytest.fixture
def pool(scratch: Path, state_dir: Path) -> Iterator[WarmPool]:
    template = scratch / "template"
    template.mkdir(mode=0o755)
    (template / "notes.txt").write_text("the task\n")
    (template / "notes.txt").chmod(0o644)
    with WarmPool(template, B, capacity=2, sink=MemorySink(), state_dir=state_dir, parked=0) as p:
        yield p


@pytest.fixture
def touches() -> Iterator[tuple[CanaryWatch, queue.Queue[DecoyTouch]]]:
    seen: queue.Queue[DecoyTouch] = queue.Queue()
    with CanaryWatch(seen.put) as watch:
        yield watch, seen


def _planter(
    watch: CanaryWatch, key: str, *, once: bool = True
) -> tuple[dict[str, object], object]:
    """A ``before`` hook for Running: plant the slot's canaries and watch the file."""
    planted: dict[str, object] = {}

    def before(slot: Slot) -> None:
        canaries = canaries_for(slot.sandbox_id, secrets.token_bytes(16))
        decoy = plant_decoy(slot.spec, canaries.credential_file, canaries.credential_text())
        planted.update(canaries=canaries, decoy=decoy, wd=watch.watch(key, decoy, once=once))

    return planted, before


SNOOP = r"""
import os, sys, time
# A snooping worker: it looks for credentials in its workspace and reads what it finds.
time.sleep(0.05)
found = [os.path.join(r, n) for r, _, ns in os.walk("/workspace") for n in ns
         if "secret" in r or n.endswith((".ini", ".key", ".pem"))]
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
    t = time.monotonic()
    with open(found[0]) as f:
        f.read()
    print(repr(t), flush=True)
    time.sleep(0.02)
"""

HONEST = r"""
import os
# What honest work does around the decoy: list the workspace, stat every entry, read
# its own files, write results. It never opens the decoy.
for root, dirs, files in os.walk("/workspace"):
    for name in files:
        os.stat(os.path.join(root, name))
open("/workspace/notes.txt").read()
with open("/workspace/result.txt", "w") as f:
    f.write("done")
while not os.path.exists("/workspace/stop"):  # alive until the host has looked
    pass
"""


def test_a_worker_reading_the_decoy_is_seen_within_one_second(
    pool: WarmPool, touches: tuple[CanaryWatch, queue.Queue[DecoyTouch]]
) -> None:
    watch, seen = touches
    planted, before = _planter(watch, "w1")
    worker = Running(pool, SNOOP, before=before)
    try:
        outcome = worker.join()
        assert outcome.exit_code == 0, outcome.stderr
        touch = seen.get(timeout=1.0)
        assert (touch.key, touch.kind) == ("w1", "open")
        opened = float((outcome.stdout or b"").decode().split()[0])
        assert 0 <= touch.seen - opened < 1.0
        # The touch, held against the sandbox's canaries, is a quarantine naming it.
        canaries = planted["canaries"]
        assert isinstance(canaries, CanarySet)
        report = CanaryTouch(
            sandbox_id=worker.slot.sandbox_id, kind="credential_file",
            value=canaries.credential_file, at_ms=1,
        )  # fmt: skip
        verdict = touched(canaries, report, lineage="w1", task_class="review", policy_version=1)
        assert isinstance(verdict, QuarantineVerdict)
        assert verdict.evidence[0].canary == f"credential_file:{canaries.credential_file}"
    finally:
        worker.release()


def test_an_honest_worker_around_the_decoy_is_not_reported(
    pool: WarmPool, touches: tuple[CanaryWatch, queue.Queue[DecoyTouch]]
) -> None:
    watch, seen = touches
    planted, before = _planter(watch, "honest")
    worker = Running(pool, HONEST, before=before)
    try:
        wait_for((worker.workspace / "result.txt").exists)
        with pytest.raises(queue.Empty):
            seen.get(timeout=0.5)  # an observation window: nothing may arrive
        # Control: the watch was armed all along: an open of the decoy is reported.
        decoy = planted["decoy"]
        assert isinstance(decoy, Decoy)
        decoy.path.read_text()
        decoy.close()
        touch = seen.get(timeout=1.0)
        assert touch.key == "honest"
        worker.stop()
        assert worker.join().exit_code == 0
    finally:
        worker.release()


def test_touch_to_detection_latency_over_50_touches(
    pool: WarmPool, touches: tuple[CanaryWatch, queue.Queue[DecoyTouch]]
) -> None:
    """p50/p99 from the worker's open (its CLOCK_MONOTONIC, which a sandbox shares with
    the host: no time namespace) to the watcher reading the event."""
    watch, seen = touches
    _, before = _planter(watch, "lat", once=False)
    worker = Running(pool, SNOOP.replace("sys.argv[1]) if len(sys.argv) > 1 else 1", "50)"),
                     before=before)  # fmt: skip
    try:
        outcome = worker.join()
        assert outcome.exit_code == 0, outcome.stderr
        opened = [float(x) for x in (outcome.stdout or b"").decode().split()]
        assert len(opened) == 50
        opens = []
        while len(opens) < 50:
            touch = seen.get(timeout=1.0)
            if touch.kind == "open":
                opens.append(touch.seen)
        lat = sorted((s - o) * 1000 for s, o in zip(opens, opened, strict=True))
        assert all(x >= 0 for x in lat)
        p50, p99 = statistics.median(lat), lat[round(0.99 * (len(lat) - 1))]
        print(f"\ncanary touch -> detection over 50 touches: p50 {p50:.3f} ms, "
              f"p99 {p99:.3f} ms, max {lat[-1]:.3f} ms")  # fmt: skip
        assert lat[-1] < 1000
    finally:
        worker.release()


def test_the_decoy_is_planted_only_as_a_new_plain_file(pool: WarmPool) -> None:
    slot = pool.lease()
    try:
        pid = sandbox_pid(slot.spec)
        assert pid is not None
        inside = Path(f"/proc/{pid}/root/workspace")
        with plant_decoy(slot.spec, ".charter-secrets/a.ini", "x") as decoy:
            assert decoy.path.read_text() == "x"
            assert (inside / ".charter-secrets/a.ini").read_text() == "x"
            assert oct((inside / ".charter-secrets/a.ini").stat().st_mode & 0o777) == "0o644"
        with pytest.raises(SandboxUnavailableError):  # never over an existing file
            plant_decoy(slot.spec, ".charter-secrets/a.ini", "y")
        os.symlink("/etc", inside / "link")
        with pytest.raises(SandboxUnavailableError):  # never through a symlink
            plant_decoy(slot.spec, "link/passwd-decoy", "y")
        assert not Path("/etc/passwd-decoy").exists()
        with pytest.raises(SandboxUnavailableError):
            plant_decoy(slot.spec, "../escape", "y")
    finally:
        pool.release(slot, refill=False)
    with pytest.raises(SandboxUnavailableError):  # a sandbox that is gone
        plant_decoy(slot.spec, "late.ini", "y")


def test_a_watch_reports_once_by_default_and_survives_a_failing_callback(tmp_path: Path) -> None:
    decoy, other = tmp_path / "decoy.ini", tmp_path / "other.ini"
    decoy.write_text("x")
    other.write_text("x")
    seen: queue.Queue[DecoyTouch] = queue.Queue()

    def report(touch: DecoyTouch) -> None:
        if touch.key == "boom":
            raise RuntimeError("the callback failed")
        seen.put(touch)

    with CanaryWatch(report) as watch:
        watch.watch("boom", other)
        watch.watch("once", decoy)
        other.read_text()  # its report fails; the watch goes on
        decoy.read_text()
        assert seen.get(timeout=1.0).key == "once"
        assert watch.failures == 1
        decoy.read_text()  # the watch is gone after its first touch
        with pytest.raises(queue.Empty):
            seen.get(timeout=0.3)
        # Control: a watch that is not one-shot reports every touch.
        watch.watch("every", decoy, once=False)
        decoy.read_text()
        decoy.read_text()
        kinds = [seen.get(timeout=1.0).kind for _ in range(4)]
        assert kinds == ["open", "access", "open", "access"]


def test_a_lost_event_is_reported_as_an_overflow(tmp_path: Path) -> None:
    """Fail closed: when the kernel's queue overflows, touches may have been lost, and
    the watch says so instead of staying silent."""
    decoy = tmp_path / "decoy.ini"
    decoy.write_text("x")
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    gate = threading.Event()
    seen: list[DecoyTouch] = []

    def slow(touch: DecoyTouch) -> None:
        gate.wait(30)  # the watcher reads nothing more meanwhile
        seen.append(touch)

    with CanaryWatch(slow) as watch:
        watch.watch("flood", decoy, once=False)
        fd = os.open(decoy, os.O_RDONLY)
        try:
            os.pread(fd, 1, 0)  # the first event: the watcher blocks in the callback
            for _ in range(limit):  # alternate kinds: identical events would be merged
                os.close(os.open(decoy, os.O_RDONLY))
                os.pread(fd, 1, 0)
        finally:
            os.close(fd)
        gate.set()
        wait_for(lambda: any(t.kind == OVERFLOW for t in seen))
