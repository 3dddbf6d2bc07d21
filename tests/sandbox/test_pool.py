"""The warm pool: leased once, discarded, never reused; capacity is the admission cap."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.core import Budget, Event, RefusedError
from charter.ledger import AppendFailedError
from charter.sandbox import (
    MemorySink,
    PoolExhaustedError,
    SandboxDiscarded,
    SandboxExited,
    SandboxLeased,
    SandboxQuarantined,
    SandboxStarted,
    SlotStateError,
    WarmPool,
)

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=10s,cpu=10s,mem=64MiB,egress=0MB")


@pytest.fixture
def template(scratch: Path) -> Path:
    t = scratch / "template"
    t.mkdir(mode=0o755)
    (t / "hello.txt").write_text("from the template\n")
    (t / "hello.txt").chmod(0o644)
    return t


@pytest.fixture
def pool(template: Path, state_dir: Path, sink: MemorySink) -> Iterator[WarmPool]:
    with WarmPool(template, B, capacity=2, sink=sink, state_dir=state_dir) as p:
        p.fill()
        yield p


def _live_processes_of(uid: int) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text().splitlines()
            except OSError:
                continue
            fields = dict(line.split(":\t", 1) for line in status if ":\t" in line)
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].startswith("Z"):
                found.append(entry.name)
    return found


def _sh(pool: WarmPool, script: str) -> tuple[int, str]:
    slot = pool.lease()
    try:
        o = slot.run(["/bin/sh", "-c", script])
        return o.exit_code, (o.stdout or b"").decode() + (o.stderr or b"").decode()
    finally:
        pool.release(slot)


def test_a_file_written_in_one_lease_is_not_in_the_next(pool: WarmPool, template: Path) -> None:
    # Control: inside one lease the write is visible, and the template is there.
    code, text = _sh(pool, "echo secret > leak.txt && cat leak.txt hello.txt")
    assert code == 0
    assert "secret" in text
    assert "from the template" in text
    # The attack: the next lease looks for it.
    code, text = _sh(pool, "ls; cat leak.txt")
    assert code != 0
    assert "No such file" in text
    assert "hello.txt" in text
    assert sorted(p.name for p in template.iterdir()) == ["hello.txt"]  # template untouched


def test_parked_slots_are_isolated_like_cold_ones(pool: WarmPool) -> None:
    _, text = _sh(pool, "touch /usr/x; unshare -U true; echo ok > /workspace/ok && echo wrote")
    assert "Read-only file system" in text
    assert "Operation not permitted" in text
    assert "wrote" in text  # control: the workspace is writable


def test_slots_are_leased_once_and_never_reused(pool: WarmPool) -> None:
    first = pool.lease()
    assert first.run(["/bin/true"]).exit_code == 0
    with pytest.raises(SlotStateError):
        first.run(["/bin/true"])  # one command per lease
    pool.release(first)
    with pytest.raises(SlotStateError):
        pool.release(first)  # released slots are gone
    seen = {first.sandbox_id}
    for _ in range(3):
        slot = pool.lease()
        assert slot.sandbox_id not in seen
        seen.add(slot.sandbox_id)
        pool.release(slot)


def test_capacity_is_the_admission_cap(pool: WarmPool) -> None:
    a, b = pool.lease(), pool.lease()
    with pytest.raises(PoolExhaustedError) as refused:
        pool.lease()
    assert isinstance(refused.value, RefusedError)  # exit 4 at the CLI
    # Backpressure: a waiting lease is admitted when another is released.
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(pool.lease(timeout=20)))
    waiter.start()
    pool.release(a)
    waiter.join(timeout=30)
    assert len(got) == 1
    assert pool.leased == 2
    pool.release(b)
    pool.release(got[0])  # type: ignore[arg-type]
    assert pool.leased == 0


def test_quarantine_destroys_and_never_returns(pool: WarmPool, sink: MemorySink) -> None:
    slot = pool.lease()
    uid = slot.spec.host_uid
    assert _live_processes_of(uid)  # control: the parked slot is alive
    pool.quarantine(slot, "honeytoken touched")
    with pytest.raises(SlotStateError):
        slot.run(["/bin/true"])
    with pytest.raises(SlotStateError):
        pool.release(slot)
    assert pool.quarantined == 1
    assert any(
        isinstance(e, SandboxQuarantined) and e.sandbox_id == slot.sandbox_id for e in sink.events
    )
    assert _live_processes_of(uid) == []  # destroyed: nothing of it runs (zombies are dead)
    assert pool.parked == 2  # refilled with a fresh slot, never the quarantined one


def test_lifecycle_is_journaled_lease_first(pool: WarmPool, sink: MemorySink) -> None:
    slot = pool.lease()
    assert isinstance(sink.events[-1], SandboxLeased)  # committed before anything runs
    slot.run(["/bin/sh", "-c", "exit 3"])
    pool.release(slot)
    mine = [e for e in sink.events if getattr(e, "sandbox_id", None) == slot.sandbox_id]
    assert [type(e) for e in mine] == [
        SandboxLeased,
        SandboxStarted,
        SandboxExited,
        SandboxDiscarded,
    ]
    assert mine[2].exit_code == 3  # type: ignore[attr-defined]


def test_pooled_wall_clock(template: Path, state_dir: Path) -> None:
    short = Budget.parse("tokens=0,wall=1s,cpu=1s,mem=64MiB,egress=0MB")
    with WarmPool(template, short, capacity=1, state_dir=state_dir) as p:
        slot = p.lease()
        o = slot.run(["/bin/sleep", "60"])
        assert o.exit_code == 124
        p.release(slot, refill=False)


def _runs(uid: int, argv0: bytes, timeout: float) -> bool:
    """Whether a process of host uid ``uid`` runs ``argv0`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in _live_processes_of(uid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.split(b"\0")[0] == argv0:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


class _StartFails:
    """A journal whose append of SandboxStarted fails (nothing written), after watching
    for the command for a while: had it been exec'd first, it would be seen running."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.uid = 0
        self.seen_running: bool | None = None

    def append(self, events: list[Event]) -> object:
        if any(isinstance(e, SandboxStarted) for e in events):
            self.seen_running = _runs(self.uid, b"/bin/sleep", 1.5)
            raise AppendFailedError("journal append failed, nothing written")
        self.events.extend(events)
        return tuple(events)


def test_a_warm_start_is_committed_before_the_command_runs(template: Path, state_dir: Path) -> None:
    failing = _StartFails()
    with WarmPool(template, B, capacity=1, sink=failing, state_dir=state_dir) as p:
        # Positive control: the watcher sees a command that a slot does exec.
        slot = p.lease()
        ran = threading.Thread(target=lambda: slot.run(["/bin/sh", "-c", "exec /bin/sleep 2"]))
        failing.uid = slot.host_uid
        p.sink = MemorySink()
        ran.start()
        assert _runs(slot.host_uid, b"/bin/sleep", 10)
        ran.join()
        p.release(slot)
        # The attack on the order: the start's append fails.
        p.sink = failing
        slot = p.lease()
        failing.uid = slot.host_uid
        with pytest.raises(AppendFailedError):
            slot.run(["/bin/sleep", "300"])
        assert failing.seen_running is False  # never exec'd while the append was pending
        assert not _runs(slot.host_uid, b"/bin/sleep", 0)
        assert _live_processes_of(slot.host_uid) == []  # the parked stub is destroyed
        with pytest.raises(SlotStateError):
            slot.run(["/bin/true"])
        p.release(slot, refill=False)
