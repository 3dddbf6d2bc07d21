"""The spawn gate: a probe pass is remembered (per boot, bwrap and sandbox code), so only
the first Launcher/WarmPool of a state directory pays for the live probe."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from charter.core import Budget
from charter.sandbox import Launcher, MemorySink, WarmPool, _gate
from charter.sandbox._host import find_bwrap

pytestmark = pytest.mark.sandbox


@pytest.fixture
def probe_runs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Counts the live probes the gate runs (each one is real)."""
    runs: list[object] = []
    real = _gate.require_isolation

    def counting(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_gate, "require_isolation", counting)
    return runs


def test_a_pass_is_remembered_until_the_fingerprint_changes(
    state_dir: Path, scratch: Path, probe_runs: list[object]
) -> None:
    marker = state_dir / "probe-pass"
    marker.unlink(missing_ok=True)  # a fresh state directory: nothing is remembered
    assert _gate.ensure_isolation(state_dir=state_dir) is not None
    assert len(probe_runs) == 1
    assert marker.read_text() == _gate._fingerprint(find_bwrap())
    # Remembered: neither the gate nor a Launcher or WarmPool probes again.
    assert _gate.ensure_isolation(state_dir=state_dir) is None
    Launcher(MemorySink(), state_dir=state_dir)
    budget = Budget.parse("tokens=0,wall=5s,cpu=5s,mem=64MiB,egress=0MB")
    WarmPool(scratch, budget, 1, state_dir=state_dir).close()
    assert len(probe_runs) == 1
    # Control: a pass recorded for anything else (another boot, bwrap or code) is not
    # used; the gate probes again and records the current fingerprint.
    marker.write_text("a pass for another boot, bwrap or sandbox code")
    assert _gate.ensure_isolation(state_dir=state_dir) is not None
    assert len(probe_runs) == 2
    assert marker.read_text() == _gate._fingerprint(find_bwrap())


def test_the_fingerprint_covers_every_sandbox_module(tmp_path: Path) -> None:
    bwrap = find_bwrap()
    copy = tmp_path / "sandbox"
    shutil.copytree(_gate._PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert _gate._fingerprint(bwrap, copy) == _gate._fingerprint(bwrap)  # same code, same
    for name in ("pool.py", "_proc.py", "egress.py"):  # not only the renderer
        original = (copy / name).read_bytes()
        (copy / name).write_bytes(original + b"\n# changed\n")
        assert _gate._fingerprint(bwrap, copy) != _gate._fingerprint(bwrap), name
        (copy / name).write_bytes(original)
    (copy / "new_module.py").write_text("")
    assert _gate._fingerprint(bwrap, copy) != _gate._fingerprint(bwrap)
