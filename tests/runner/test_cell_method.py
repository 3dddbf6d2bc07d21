"""``Charter.cell``: the composition root hands out the cell, built by the runner (the
layer above it, which registers how) on the root's own services; the root never
imports the runner. Each case runs in a fresh interpreter: what is registered is the
process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runner.conftest import initialise

WT = Path(__file__).resolve().parents[2]

# What a fresh process sees: whether the runner was loaded before the first cell, the
# cell's class, and whether every service it decides through is the root's own.
PROBE = """
import json, sys
from pathlib import Path
from charter.core import KeyStore
{reach}
app = Charter.open(sys.argv[1], keys=KeyStore(Path(sys.argv[2])))
before = "charter.runner" in sys.modules
try:
    cell = app.cell(state_dir=Path(sys.argv[3]))
except Exception as error:
    print(json.dumps({{"before": before, "error": type(error).__name__, "says": str(error)}}))
    raise SystemExit(0)
print(json.dumps({{
    "before": before,
    "class": type(cell).__module__ + "." + type(cell).__name__,
    "cell": cell.cell,
    "root": cell.app is app,
    "budgets": cell.budgets is app.budgets(),
    "admission": cell.admission is app.admission(),
    "views": cell.resources is app.views.resources,
}}))
app.close()
"""


def _probe(reach: str, url: str, home: Path, state: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(WT), "CHARTER_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(reach=reach), url, str(home), str(state)],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize(
    "reach",
    [
        "import charter\nCharter = charter.Charter",  # the package: the runner on first use
        "import charter.runner\nfrom charter.app import Charter",  # the runner registered
    ],
    ids=["package", "runner-imported"],
)
def test_the_root_hands_out_a_cell_on_its_own_services(
    journal_url: str, tmp_path: Path, state_dir: Path, reach: str
) -> None:
    initialise(journal_url, tmp_path / "home").close()
    found = _probe(reach, journal_url, tmp_path / "home", state_dir)
    assert found == {
        "before": "import charter.runner" in reach,  # the package loads it only now
        "class": "charter.runner.cell.Cell",
        "cell": "local",
        "root": True,
        "budgets": True,
        "admission": True,
        "views": True,
    }


def test_without_a_runner_the_root_refuses_to_build_a_cell(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # charter.app alone (the root, below the runner): nothing registered, a clear refusal.
    initialise(journal_url, tmp_path / "home").close()
    found = _probe("from charter.app import Charter", journal_url, tmp_path / "home", state_dir)
    assert found["before"] is False
    assert found["error"] == "StateError"
    assert "import charter.runner" in str(found["says"])
