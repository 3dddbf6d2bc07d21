"""A home initialised by the real ``charter init`` (SQLite), shared by the CLI tests."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli._run import charter

FANOUT_COST = "tokens=5M,wall=200m,cpu=200m,mem=200MiB,egress=0"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """``charter init`` into ``tmp_path/home`` (root agent ``agent:root``)."""
    made = charter("--quiet", "init", home=tmp_path / "home")
    assert made.returncode == 0, made.stderr
    return tmp_path / "home"


def spawn(home: Path, width: int) -> list[str]:
    """A real fan-out of ``width`` workers under agent:root; the minted lineages."""
    done = charter(
        "--json", "spawn", "--parent", "agent:root", "--width", str(width), "--objective",
        "scan the estate host by host", "--est-cost", FANOUT_COST, home=home,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    children: list[str] = json.loads(done.stdout)["children"]
    return children


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is root's only)."""
    with tempfile.TemporaryDirectory(prefix="charter-cli-") as top:
        Path(top).chmod(0o755)
        yield Path(top)
