"""An idle cell parks only what may run at once: its processing cap, never the whole
pool capacity (which also holds room for waiting coordinators). Real sandboxes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.runner._support import make_cell
from tests.runner.conftest import initialise


@pytest.mark.sandbox
@pytest.mark.parametrize("processing", [1, 2])
def test_an_idle_cell_parks_its_processing_cap_not_its_capacity(
    sqlite_url: str, tmp_path: Path, state_dir: Path, processing: int
) -> None:
    with initialise(sqlite_url, tmp_path / "home", processing=processing, coordination=16) as c:
        cell = make_cell(c, None, state_dir)
        cell.open()
        try:
            pool = cell.pool
            assert pool is not None
            assert pool.capacity == processing + 16  # room for 16 waiting coordinators
            pool.fill()  # returns once the target is parked or being built
            deadline = time.monotonic() + 30
            while pool.parked < processing and time.monotonic() < deadline:
                assert pool.live <= processing  # never builds past its target
                time.sleep(0.01)
            assert pool.parked == processing
            assert pool.live == processing  # not the capacity: no idle uids held for it
        finally:
            cell.close()
