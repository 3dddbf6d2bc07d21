"""Fixtures for the cell: a real journal (both backends), a home, real bwrap sandboxes."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.app import CellSetup, Charter, Settings
from charter.budgets import CapInputs
from charter.control import Ceiling
from charter.core import Budget, KeyStore

ROOT_BUDGET = Budget.parse("tokens=1M,wall=2h,cpu=2h,mem=64GiB,egress=1GB")
SLOT_BUDGET = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=256MiB,egress=0MB")


def steady(cores: int, reserve: int) -> CapInputs:
    """The cap's inputs with the host's load left out: tests share a loaded machine,
    and the adaptive cap (its own tests) would shrink the cell under them."""
    return CapInputs(cores=cores, failover_reserve=reserve, load_average=0.0, live_peers=0)


@pytest.fixture(autouse=True)
def _no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))


@pytest.fixture(scope="session")
def state_dir() -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        pytest.fail("cell tests run as root with bubblewrap installed (scripts/setup)")
    path = Path(tempfile.mkdtemp(prefix="charter-cell-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def template(state_dir: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tpl-", dir=state_dir))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def initialise(
    url: str,
    home: Path,
    *,
    processing: int = 2,
    coordination: int = 2,
    egress: frozenset[str] = frozenset(),
) -> Charter:
    charter, _ = Charter.initialise(
        url,
        root="estate",
        ceiling=Ceiling(budget=ROOT_BUDGET, depth=4, fanout=200, egress=egress),
        cell=CellSetup(cores=2, processing=processing, coordination=coordination),
        keys=KeyStore(home),
        settings=Settings(),
    )
    return charter


@pytest.fixture
def own_state() -> Iterator[Path]:
    """A sandbox state directory of this test's own (mode 0755, as sandboxes need): its
    uid locks and sockets are this test's alone."""
    path = Path(tempfile.mkdtemp(prefix="charter-own-state-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
