"""Item 12: ``import charter`` is the documented Python API, cheap to import, and the
guide's example runs as written; the README links only inside the repository."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import charter
from tests.cli._run import ROOT


def test_every_exported_name_is_the_defining_object() -> None:
    from charter.app import Charter
    from charter.authority import SpawnIntent
    from charter.core import Budget, CharterError

    assert charter.Charter is Charter
    assert charter.SpawnIntent is SpawnIntent
    assert charter.Budget is Budget
    assert charter.CharterError is CharterError
    for name in charter.__all__:
        assert getattr(charter, name) is not None
    assert set(charter.__all__) <= set(dir(charter))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = charter.Nope  # type: ignore[attr-defined]


def test_import_charter_loads_nothing_heavy() -> None:
    probe = (
        "import sys, json, charter; before = sorted(sys.modules); charter.Charter; "
        "print(json.dumps([before, sorted(sys.modules)]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True,
        cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    before, after = json.loads(done.stdout)
    heavy = {"pydantic", "charter.app", "charter.ledger", "charter.sandbox", "nacl"}
    assert not heavy & set(before)
    assert heavy <= set(after)  # control: asking for a name does load them


def test_the_guide_example_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert example is not None
    exec(compile(example.group(1), "docs/api.md", "exec"), {})
    out = capsys.readouterr().out
    assert "refused before journaling: no lease or budget ledger" in out
    assert re.search(r"^tokens=\d+,wall=\d+ms", out, re.MULTILINE)


@pytest.mark.parametrize("page", ["README.md", "docs/api.md", "docs/cli.md"])
def test_links_stay_inside_the_repository(page: str) -> None:
    path = ROOT / page
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    local = [t for t in targets if "://" not in t]
    assert local  # control: the pattern does find the page's links
    for target in local:
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), target
        assert resolved.exists(), target
