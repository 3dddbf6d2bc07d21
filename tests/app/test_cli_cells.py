"""``charter init`` configures this host's cell, ``charter slots`` shows it, and
``charter cell configure`` journals new caps (refusing a cap below the slots held)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.journal.test_cli import charter


def _slots(home: Path) -> dict[str, object]:
    result = charter("--json", "slots", home=home)
    assert result.returncode == 0, result.stderr
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def test_init_configures_the_cell_and_slots_shows_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    made = charter("init", "--cores", "4", "--reserve", "1", home=home)
    assert made.returncode == 0, made.stderr
    (cell,) = _slots(home)["cells"]  # type: ignore[misc]
    assert cell["cell"] == "local"
    assert cell["cores"] == 4
    assert cell["slots"]["processing"]["cap"] == 3

    configured = charter(
        "--json", "cell", "configure", "--cores", "4", "--processing", "2", home=home
    )
    assert configured.returncode == 0, configured.stderr
    assert json.loads(configured.stdout)["caps"]["processing"] == 2
    (cell,) = _slots(home)["cells"]  # type: ignore[misc]
    assert cell["slots"]["processing"]["cap"] == 2


def test_a_spawn_is_admitted_to_the_cell_or_queued_never_over_its_cap(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert charter("init", "--cores", "2", home=home).returncode == 0
    spawned = charter(
        "--json",
        "spawn",
        "--parent",
        "agent:root",
        "--width",
        "3",
        "--objective",
        "scan the estate host by host",
        "--est-cost",
        "tokens=30k,wall=3m,cpu=3m,mem=96MiB,egress=3MB",
        "--",
        "/bin/true",  # children that run something take slots; the others do not
        home=home,
    )
    assert spawned.returncode == 0, spawned.stderr
    doc = json.loads(spawned.stdout)
    # The processing cap adapts to the host's load (at most 2 here): never over it.
    assert len(doc["admitted"]) <= 2
    assert doc["admitted"] + doc["queued"] == doc["children"]
    (cell,) = _slots(home)["cells"]  # type: ignore[misc]
    assert cell["slots"]["processing"]["occupancy"] == len(doc["admitted"])

    # (A cap below the slots held is refused: tests/budgets/test_admission.py.)


def test_a_reserve_that_leaves_no_core_is_a_usage_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = charter("init", "--cores", "2", "--reserve", "2", home=home)
    assert result.returncode == 2
    assert not (home / "journal.db").exists()
    assert charter("init", "--cores", "2", home=home).returncode == 0  # control
    result = charter("cell", "configure", "--cores", "2", "--reserve", "3", home=home)
    assert result.returncode == 2
    assert "leaves none of 2 cores" in result.stderr
