"""Fixtures for real sandboxes: root, Debian's bubblewrap, a state dir sandboxes can reach."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import Launcher, MemorySink

SMALL = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=128MiB,egress=0MB")


def _require_host() -> None:
    if os.geteuid() != 0:
        pytest.fail("sandbox tests run as root (the launcher drops to a per-sandbox host uid)")
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is missing: run scripts/setup (apt-get install bubblewrap)")


@pytest.fixture(scope="session")
def state_dir() -> Iterator[Path]:
    """Under /tmp with mode 0755: sandbox uids must traverse it to reach workspaces."""
    _require_host()
    path = Path(tempfile.mkdtemp(prefix="charter-sbx-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def launcher(state_dir: Path, sink: MemorySink) -> Launcher:
    return Launcher(sink, state_dir=state_dir)


@pytest.fixture
def scratch(state_dir: Path) -> Iterator[Path]:
    """A host directory sandboxes can reach (for workspaces and templates)."""
    path = Path(tempfile.mkdtemp(prefix="scratch-", dir=state_dir))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
