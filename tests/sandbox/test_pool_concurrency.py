"""The warm pool under concurrent lease/release: capacity bounds every live sandbox.

Each slot holds a host uid, a cgroup and a parked bwrap process. Several threads lease,
run and release (each release refills on its own thread) while the test counts, against
the capacity: the pool's own books (parked + leased + being built + being destroyed), the
uids the pool holds (counted at every allocation and release, so no peak is missed) and
the sandbox uids with a live process on the host.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import SandboxUnavailableError, WarmPool
from charter.sandbox import pool as pool_module
from charter.sandbox._host import UID_RANGE, UidLease, allocate_uid
from charter.sandbox.spec import FIRST_SANDBOX_UID

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=0MB")
CAPACITY, WORKERS, CYCLES = 2, 5, 12


class UidCounter:
    """Wraps ``allocate_uid`` for the pool: how many uids it holds now, and at most."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held = self.most = self.allocated = 0
        self.uids: set[int] = set()  # every uid this pool was given

    def allocate(self, state_dir: Path) -> UidLease:
        real = allocate_uid(state_dir)
        fd, real._fd = real._fd, None  # hand the flock over to the counted lease
        assert fd is not None
        counter = self

        class Counted(UidLease):
            def release(self) -> None:
                held = self._fd is not None
                super().release()
                if held:
                    with counter.lock:
                        counter.held -= 1

        with self.lock:
            self.held += 1
            self.allocated += 1
            self.uids.add(real.uid)
            self.most = max(self.most, self.held)
        return Counted(real.uid, fd)


def _sandbox_processes() -> dict[int, tuple[int, str]]:
    """pid -> (uid, start time) of live (non-zombie) processes running as a sandbox uid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text().splitlines()
            start = (entry / "stat").read_text().rsplit(")", 1)[1].split()[19]
        except (OSError, IndexError):
            continue
        fields = dict(line.split(":\t", 1) for line in status if ":\t" in line)
        uid = int(fields["Uid"].split()[0])
        in_range = FIRST_SANDBOX_UID <= uid < FIRST_SANDBOX_UID + UID_RANGE
        if in_range and not fields["State"].startswith("Z"):
            found[int(entry.name)] = (uid, start)
    return found


def _live_sandbox_uids() -> set[int]:
    """Sandbox uids with a process alive at one common instant. A scan of /proc is not
    atomic (a slot seen early may die before a later one is seen), so only processes
    found again, unchanged, by a second pass count: every one of those was alive from
    the end of the first pass to the start of the second."""
    first = _sandbox_processes()
    again = _sandbox_processes()
    return {uid for pid, (uid, start) in first.items() if again.get(pid) == (uid, start)}


def test_concurrent_lease_release_never_exceeds_capacity(
    scratch: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = scratch / "template"
    template.mkdir(mode=0o755)
    base_uids = _live_sandbox_uids()
    uids = UidCounter()
    monkeypatch.setattr(pool_module, "allocate_uid", uids.allocate)

    errors: list[BaseException] = []
    runs = []
    done = threading.Barrier(WORKERS + 1)
    closed = threading.Event()

    def worker(pool: WarmPool) -> None:
        try:
            for _ in range(CYCLES):
                slot = pool.lease(timeout=60)
                try:
                    runs.append(slot.run(["/bin/true"], capture=False).exit_code)
                finally:
                    pool.release(slot)  # refills on this thread
        except BaseException as e:
            errors.append(e)
        finally:
            done.wait(timeout=120)
            # Slots parked by this thread die with it (--die-with-parent): stay alive
            # until the pool has destroyed them.
            closed.wait(timeout=120)

    seen_pool = seen_parked = seen_uids = samples = 0

    def observe(pool: WarmPool) -> None:
        nonlocal seen_pool, seen_parked, seen_uids, samples
        samples += 1
        seen_pool = max(seen_pool, pool.live)  # parked + leased + building + dropping
        seen_parked = max(seen_parked, pool.parked)
        # Only uids this pool was given: other sandboxes on the host (another test run,
        # another engineer's cell) hold other uids from the same range at the same time.
        live = (_live_sandbox_uids() - base_uids) & uids.uids
        seen_uids = max(seen_uids, len(live))

    threads: list[threading.Thread] = []
    try:
        with WarmPool(template, B, capacity=CAPACITY, state_dir=state_dir) as pool:
            threads += [threading.Thread(target=worker, args=(pool,)) for _ in range(WORKERS)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 120
            while done.n_waiting < WORKERS and any(t.is_alive() for t in threads):
                assert time.monotonic() < deadline, "the workers did not finish in time"
                observe(pool)
            done.wait(timeout=10)  # every worker has finished its cycles and refills
            observe(pool)
            assert pool.leased == 0
            assert pool.parked == CAPACITY  # control: refilled to capacity, not beyond
    finally:
        closed.set()  # the pool is closed: its slots are gone, the workers may end
        for t in threads:
            t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)

    assert errors == []
    assert runs == [0] * (WORKERS * CYCLES)  # control: every lease ran its command
    assert samples > 10  # control: the observer really watched the run
    assert seen_uids >= 1  # control: the host-side observation sees live slots
    assert uids.allocated >= WORKERS * CYCLES  # control: every slot's uid was counted
    seen = {"pool": seen_pool, "parked": seen_parked, "uids held": uids.most, "live": seen_uids}
    assert all(n <= CAPACITY for n in seen.values()), seen
    # Closed: every uid is given back and no process of any slot remains.
    assert uids.held == 0
    assert _live_sandbox_uids() <= base_uids


def test_a_closed_pool_parks_nothing_and_refuses_leases(scratch: Path, state_dir: Path) -> None:
    with WarmPool(scratch, B, capacity=1, state_dir=state_dir) as pool:
        pool.fill()
        assert pool.live == 1  # control: filled
        pool.close()
        assert pool.live == 0
        pool.fill()  # a refill after the close (a late release) parks nothing
        assert pool.live == 0
        with pytest.raises(SandboxUnavailableError):
            pool.lease()
