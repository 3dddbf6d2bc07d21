"""A host that stops being able to isolate: no bubblewrap, or cgroups that became
unusable after a remembered probe pass. Both are refusals (exit 4), journaled, and no
lease is left without its end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from charter.ledger import Journal
from tests.invariants import journal_history

from .test_interrupt import dangling_leases

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
LIFECYCLE = ("SandboxLeased", "SandboxStarted", "SandboxExited", "SandboxDiscarded")

# Every cgroup hierarchy remounted read-only, in a private mount namespace (the host's
# cgroups are untouched), then the command.
READ_ONLY_CGROUPS = (
    "for m in $(findmnt -R -l -n -o TARGET /sys/fs/cgroup | tail -n +2); do "
    'mount -o remount,bind,ro "$m" || exit 99; done; exec "$@"'
)


def _charter(
    env: dict[str, str], *args: str, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "charter", *args], capture_output=True, text=True,
        timeout=120, cwd=REPO, check=False, env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )  # fmt: skip


@pytest.fixture
def env(tmp_path: Path, state_dir: Path) -> dict[str, str]:
    env = {
        "CHARTER_HOME": str(tmp_path / "home"),
        "CHARTER_DB": f"sqlite:///{tmp_path}/journal.db",
        "CHARTER_SANDBOX_STATE": str(state_dir),
    }
    assert _charter(env, "init").returncode == 0
    return env


def _entries(url: str, *types: str) -> list[tuple[str, object]]:
    with Journal.open(url) as journal:
        return [(e.type_name, e.event) for e in journal.entries(types=types)]


def test_a_host_without_bubblewrap_is_refused_and_journaled(env: dict[str, str]) -> None:
    run = ("sandbox", "run", "--", "/bin/true")
    # Positive control: with bubblewrap on the PATH the command runs.
    assert _charter(env, *run).returncode == 0
    no_bwrap = {**env, "PATH": "/nonexistent", "CHARTER_BWRAP": ""}
    r = _charter(no_bwrap, *run)
    assert r.returncode == 4, r.stderr
    assert "bubblewrap is not installed" in r.stderr
    assert "Traceback" not in r.stderr
    refusals = _entries(env["CHARTER_DB"], "SandboxProbeRefused")
    assert [e.failed for _, e in refusals] == [("bwrap_installed",)]  # type: ignore[attr-defined]


def test_unusable_cgroups_after_a_remembered_pass_are_refused_and_end_the_lease(
    env: dict[str, str], state_dir: Path
) -> None:
    run = ("sandbox", "run", "--", "/bin/true")
    # Positive control: the host isolates, and its probe pass is remembered.
    assert _charter(env, *run).returncode == 0
    assert (state_dir / "probe-pass").exists()
    before = len(_entries(env["CHARTER_DB"], *LIFECYCLE))
    r = _charter(env, *run, prefix=("unshare", "-m", "--propagation", "private", "sh", "-c",
                                    READ_ONLY_CGROUPS, "sh"))  # fmt: skip
    assert r.returncode == 4, r.stderr
    assert "cgroup" in r.stderr
    assert "Traceback" not in r.stderr
    names = [name for name, _ in _entries(env["CHARTER_DB"], *LIFECYCLE)[before:]]
    assert names == ["SandboxLeased", "SandboxDiscarded"]  # the lease has its end; no start
    with Journal.open(env["CHARTER_DB"]) as journal:
        assert dangling_leases(journal_history(journal)) == set()
    assert not (state_dir / "probe-pass").exists()  # the pass is forgotten: probe again
    # The next run on the healthy host probes again, and runs.
    assert _charter(env, *run).returncode == 0
    assert (state_dir / "probe-pass").exists()


def test_the_probes_canary_is_journaled(env: dict[str, str]) -> None:
    r = _charter(env, "--json", "sandbox", "probe")
    assert r.returncode == 0, r.stderr
    names = [name for name, _ in _entries(env["CHARTER_DB"], *LIFECYCLE)]
    assert names == list(LIFECYCLE)  # the canary sandbox, end to end
