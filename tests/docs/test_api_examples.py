"""docs/api.md's examples run as written, in order, in one namespace (a block after a
``<!-- not run ... -->`` comment says why it is not run), and the retry example shows
that the same ``request_id`` never mints twice."""

from __future__ import annotations

import re

import pytest

from tests.docs import ROOT

_BLOCK = re.compile(r"(<!-- not run[^>]*-->\n)?```python\n(.*?)```", re.DOTALL)


def test_every_example_of_the_api_guide_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = _BLOCK.findall((ROOT / "docs" / "api.md").read_text())
    run = [code for skipped, code in blocks if not skipped]
    assert len(run) >= 2  # control: the guide and the retry example are both found
    assert len(run) < len(blocks)  # and the cell's example is the one not run
    namespace: dict[str, object] = {}
    for i, code in enumerate(run):
        exec(compile(code, f"docs/api.md block {i + 1}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "refused before journaling" in out
    assert re.search(r"^one fan-out at positions \(\d+, \d+\)$", out, re.MULTILINE)


def test_the_examples_that_are_not_run_still_compile() -> None:
    for skipped, code in _BLOCK.findall((ROOT / "docs" / "api.md").read_text()):
        compile(code, "docs/api.md", "exec")
        del skipped
