"""``charter init`` configures this host's cell, ``charter slots`` shows it, and
``charter cell configure`` journals new caps (refusing a cap below the slots held)."""

from __future__ import annotations

import json
import subprocess
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


def _spawn(home: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return charter(
        "--json", "spawn", "--parent", "agent:root", "--width", "2",
        "--objective", "render the frames on a gpu cell",
        "--est-cost", "tokens=20k,wall=2m,cpu=2m,mem=64MiB,egress=2MB",
        *options, home=home,
    )  # fmt: skip


def test_a_spawn_asking_a_class_no_live_cell_has_is_refused_exit_4(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert charter("init", "--cores", "2", home=home).returncode == 0
    assert _spawn(home, "--", "/bin/true").returncode == 0  # positive control: no class
    refused = _spawn(home, "--class", "gpu", "--", "/bin/true")
    assert refused.returncode == 4, refused.stderr
    doc = json.loads(refused.stdout)
    assert doc["reason"] == "no-cell-of-class"
    assert doc["error"] == "NoCellOfClassError"
    assert "charter: refused (no-cell-of-class)" in refused.stderr
    shown = charter("--json", "journal", "show", "--type", "SpawnRefused", home=home)
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [x["payload"]["reason"] for x in lines] == ["no-cell-of-class"]


def test_class_names_and_cell_with_class_are_usage_errors(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert charter("init", "--cores", "2", home=home).returncode == 0
    for bad in ("GPU", "gpu big", "9gpu", "g" * 33, ""):
        result = _spawn(home, "--class", bad, "--", "/bin/true")
        assert result.returncode == 2, (bad, result.stderr)
        assert "a cell class is a short lowercase token" in result.stderr
        run = charter("cell", "run", "--once", "--class", "cpu", "--class", bad, home=home)
        assert run.returncode == 2, (bad, run.stderr)
        assert "a cell class is a short lowercase token" in run.stderr
    both = _spawn(home, "--cell", "a", "--class", "gpu", "--", "/bin/true")
    assert both.returncode == 2
    assert "give one" in both.stderr
    bare = _spawn(home, "--class", "gpu")  # minted only: nothing runs anywhere
    assert bare.returncode == 2
    assert "--class runs workers" in bare.stderr
    shown = charter("--json", "journal", "show", "--type", "SpawnRefused", home=home)
    assert shown.stdout == ""  # usage errors journal nothing
