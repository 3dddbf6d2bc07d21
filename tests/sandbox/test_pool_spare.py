"""Parking ahead: ``spare`` slots may be parked beyond the pool's capacity but never
leased beyond it, and a lease waits for a slot being parked rather than building one
from nothing on the caller's thread (real sandboxes)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import PoolExhaustedError, Slot, WarmPool

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=10s,cpu=10s,mem=64MiB,egress=0MB")


@pytest.fixture
def template(scratch: Path) -> Path:
    t = scratch / "template"
    t.mkdir(mode=0o755)
    return t


def test_spare_slots_are_parked_beyond_the_capacity_and_never_leased_beyond_it(
    template: Path, state_dir: Path
) -> None:
    with WarmPool(template, B, capacity=1, parked=2, spare=1, state_dir=state_dir) as pool:
        pool.fill()
        assert (pool.parked, pool.live) == (2, 2)  # one spare parked beyond the capacity
        first = pool.lease()
        with pytest.raises(PoolExhaustedError):  # a parked spare is not a second lease
            pool.lease(timeout=0.2)
        assert (pool.leased, pool.parked) == (1, 1)
        pool.release(first, refill=False)
        second = pool.lease()  # control: with the first given back, the spare is leased
        assert second.sandbox_id != first.sandbox_id
        pool.release(second, refill=False)
    with WarmPool(template, B, capacity=1, parked=2, state_dir=state_dir) as pool:
        pool.fill()  # control: without a spare, nothing is parked beyond the capacity
        assert (pool.parked, pool.live) == (1, 1)


def test_a_lease_waits_for_a_slot_being_parked_instead_of_building_one(
    template: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    building = threading.Event()
    go_on = threading.Event()
    builders: list[str] = []
    real = WarmPool._build

    def build(self: WarmPool) -> Slot:
        builders.append(threading.current_thread().name)
        if threading.current_thread().name == "filler":
            building.set()
            assert go_on.wait(60)
        return real(self)

    monkeypatch.setattr(WarmPool, "_build", build)
    with WarmPool(template, B, capacity=2, parked=1, state_dir=state_dir) as pool:
        filler = threading.Thread(target=pool.fill, name="filler")
        filler.start()
        assert building.wait(60)  # a slot is being built to be parked
        leased: list[Slot] = []
        lessee = threading.Thread(target=lambda: leased.append(pool.lease(timeout=60)))
        lessee.start()
        lessee.join(timeout=0.5)
        assert lessee.is_alive()  # waiting,
        assert builders == ["filler"]  # building nothing
        go_on.set()
        lessee.join(timeout=60)
        filler.join(timeout=60)
        assert len(leased) == 1  # it took the parked slot
        assert builders == ["filler"]
        pool.release(leased[0], refill=False)
        # Control: with nothing being parked, a lease builds its own slot (cold).
        builders.clear()
        while pool.parked:
            pool.release(pool.lease(), refill=False)
        builders.clear()
        pool.release(pool.lease(), refill=False)
        assert builders == [threading.current_thread().name]
