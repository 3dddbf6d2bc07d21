"""Fixtures for the page's tests: a real journal (both backends) with the estate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.app import Charter
from charter.serve import Fabric
from tests.runner.conftest import initialise


@pytest.fixture
def estate(journal_url: str, charter_home: Path) -> Iterator[Charter]:
    charter = initialise(journal_url, charter_home)
    with charter:
        yield charter


@pytest.fixture
def fabric(estate: Charter, journal_url: str) -> Iterator[Fabric]:
    fabric = Fabric(journal_url)
    try:
        yield fabric
    finally:
        fabric.close()


# the cell tests' real bwrap sandboxes (their fixtures), for a running fan-out
from tests.runner.conftest import _no_load, state_dir  # noqa: E402

__all__ = ["_no_load", "estate", "fabric", "state_dir"]
