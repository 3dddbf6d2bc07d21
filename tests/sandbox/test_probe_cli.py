"""Fail closed: the probe passes here and refuses a weakened bwrap; the CLI contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from charter.core import Event
from charter.ledger import Journal
from charter.sandbox import (
    HostCannotIsolateError,
    MemorySink,
    SandboxProbeRefused,
    SandboxStarted,
    probe,
    require_isolation,
)
from charter.sandbox._canary import CANARY

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]

WEAK_BWRAP = """#!/usr/bin/python3
# A bwrap that silently drops one isolation flag (and its arguments), then runs the real one.
import os, sys
flag, nargs = {flag!r}, {nargs}
argv, out, i = sys.argv[1:], [], 0
while i < len(argv):
    if argv[i] == flag and "--" not in argv[:i]:
        i += 1 + nargs
        continue
    out.append(argv[i])
    i += 1
os.execv("/usr/bin/bwrap", ["bwrap", *out])
"""


def _weak_bwrap(where: Path, flag: str, nargs: int) -> str:
    path = where / f"bwrap-without{flag}"
    path.write_text(WEAK_BWRAP.format(flag=flag, nargs=nargs))
    path.chmod(0o755)
    return str(path)


def test_probe_passes_on_this_host(state_dir: Path) -> None:
    report = probe(state_dir=state_dir)
    assert report.ok, [c for c in report.checks if not c.ok]
    names = {c.name for c in report.checks}
    for name in ("root_only_file_unreadable", "environment_cleared", "no_host_loopback",
                 "no_nested_userns", "seccomp_filter", "pids_cap", "memory_cap",
                 "all_namespaces_unshared", "unprivileged_host_uid", "read_only_root",
                 "rlimits_final", "init_environment_clean", "init_process_hidden",
                 "socket_families_allow_listed", "parent_death_signal_kept",
                 "workspace_nosuid_nodev", "no_terminal"):  # fmt: skip
        assert name in names


@pytest.mark.parametrize(
    ("flag", "nargs", "caught_by"),
    [
        ("--clearenv", 0, "environment_cleared"),
        ("--unshare-net", 0, "no_host_loopback"),
        ("--seccomp", 1, "seccomp_filter"),
        ("--remount-ro", 1, "read_only_root"),
    ],
)
def test_probe_refuses_a_weakened_sandbox(
    state_dir: Path, scratch: Path, flag: str, nargs: int, caught_by: str
) -> None:
    sink = MemorySink()
    with pytest.raises(HostCannotIsolateError):
        require_isolation(sink, state_dir=state_dir, bwrap=_weak_bwrap(scratch, flag, nargs))
    refused = [e for e in sink.events if isinstance(e, SandboxProbeRefused)]
    assert len(refused) == 1
    assert caught_by in refused[0].failed


LEAKY_BWRAP = """#!/usr/bin/python3
# A bwrap started with the launcher's environment: the probe's canary variable (named in
# the canary's argv) is put back into bwrap's own environment, so bwrap's pid 1 holds it;
# and pid 1's /proc entry is not hidden (the --tmpfs /proc/1 and its remount dropped).
import os, sys
leaked = {a: "leaked" for a in sys.argv if a.startswith("CHARTER_PROBE_CANARY_")}
argv = sys.argv[1:]
if "--proc" in argv:
    i = argv.index("--proc") + 2
    assert argv[i:i + 6] == ["--size", "4096", "--tmpfs", "/proc/1", "--remount-ro", "/proc/1"]
    del argv[i:i + 6]
os.execve("/usr/bin/bwrap", ["bwrap", *argv], {**os.environ, **leaked})
"""


def test_probe_refuses_a_bwrap_whose_init_holds_the_environment(
    state_dir: Path, scratch: Path
) -> None:
    """--clearenv still clears the command's environment, but bwrap's own pid 1 (readable
    at /proc/1/environ inside once its /proc entry is not hidden) holds the launcher's:
    the probe catches both."""
    leaky = scratch / "bwrap-leaky"
    leaky.write_text(LEAKY_BWRAP)
    leaky.chmod(0o755)
    sink = MemorySink()
    with pytest.raises(HostCannotIsolateError):
        require_isolation(sink, state_dir=state_dir, bwrap=str(leaky))
    refused = [e for e in sink.events if isinstance(e, SandboxProbeRefused)]
    assert len(refused) == 1
    assert set(refused[0].failed) == {"init_environment_clean", "init_process_hidden"}
    # Control: the same probe through the real bwrap passes that check.
    report = probe(state_dir=state_dir)
    assert {c.name: c.ok for c in report.checks}["init_environment_clean"] is True


DEV_BIND_BWRAP = """#!/usr/bin/python3
# A bwrap that binds a plain host directory at /workspace with devices allowed
# (--dev-bind), instead of the launcher's nosuid,nodev overlay.
import os, sys
argv = sys.argv[1:]
for i in range(len(argv) - 2):
    if argv[i] == "--bind" and argv[i + 2] == "/workspace":
        argv[i:i + 3] = ["--dev-bind", {host_dir!r}, "/workspace"]
        break
os.execv("/usr/bin/bwrap", ["bwrap", *argv])
"""


def test_probe_refuses_a_workspace_mounted_with_devices(state_dir: Path, scratch: Path) -> None:
    host_dir = scratch / "plain"
    host_dir.mkdir(mode=0o777)
    host_dir.chmod(0o777)
    weak = scratch / "bwrap-dev-bind"
    weak.write_text(DEV_BIND_BWRAP.format(host_dir=str(host_dir)))
    weak.chmod(0o755)
    sink = MemorySink()
    with pytest.raises(HostCannotIsolateError):
        require_isolation(sink, state_dir=state_dir, bwrap=str(weak))
    refused = [e for e in sink.events if isinstance(e, SandboxProbeRefused)]
    assert "workspace_nosuid_nodev" in refused[0].failed
    assert "canary_ran" not in refused[0].failed  # control: the canary ran and reported


def _canary_only(events: list[Event]) -> bool:
    """Every sandbox started among ``events`` is the probe's canary."""
    return all(CANARY in e.command for e in events if isinstance(e, SandboxStarted))


def test_launcher_and_pool_refuse_to_spawn_on_a_weak_host(state_dir: Path, scratch: Path) -> None:
    from charter.core import Budget
    from charter.sandbox import Launcher, WarmPool

    weak = _weak_bwrap(scratch, "--clearenv", 0)
    sink = MemorySink()
    with pytest.raises(HostCannotIsolateError):
        Launcher(sink, state_dir=state_dir, bwrap=weak)
    with pytest.raises(HostCannotIsolateError):
        WarmPool(scratch, Budget.parse("tokens=0,wall=5s,cpu=5s,mem=64MiB,egress=0MB"), 1,
                 sink=sink, state_dir=state_dir, bwrap=weak)  # fmt: skip
    # Each refusal is journaled after its canary's own lifecycle (the canary is a
    # sandbox like any other); no other sandbox was leased.
    assert [type(e) for e in sink.events if isinstance(e, SandboxProbeRefused)] == [
        SandboxProbeRefused, SandboxProbeRefused,
    ]  # fmt: skip
    assert _canary_only(sink.events)


def _charter(
    *args: str, env: dict[str, str], check_rc: int | None = None
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "charter", *args], capture_output=True, text=True, timeout=120,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env}, check=False,
    )  # fmt: skip
    if check_rc is not None:
        assert r.returncode == check_rc, (r.returncode, r.stdout, r.stderr)
    return r


@pytest.fixture
def cli_env(tmp_path: Path, state_dir: Path) -> dict[str, str]:
    env = {
        "CHARTER_HOME": str(tmp_path / "home"),
        "CHARTER_DB": f"sqlite:///{tmp_path}/journal.db",
        "CHARTER_SANDBOX_STATE": str(state_dir),
    }
    _charter("init", env=env, check_rc=0)
    return env


def test_cli_run_passes_exit_codes_through(cli_env: dict[str, str]) -> None:
    short = "tokens=0,wall=1s,cpu=1s,mem=64MiB,egress=0MB"
    _charter("sandbox", "run", "--", "/bin/sh", "-c", "exit 7", env=cli_env, check_rc=7)
    _charter("sandbox", "run", "--budget", short, "--", "sleep", "30", env=cli_env, check_rc=124)
    _charter("sandbox", "run", "--", "/bin/sh", "-c", "kill -TERM $$", env=cli_env, check_rc=143)
    r = _charter("--json", "sandbox", "run", "--", "/bin/echo", "hi", env=cli_env, check_rc=0)
    result = json.loads(r.stdout)  # stdout is only the JSON document
    assert result["exit_code"] == 0
    assert "hi" in r.stderr  # the command's output went to stderr
    with Journal.open(cli_env["CHARTER_DB"]) as journal:
        # The lifecycle, in order, for each of the four runs.
        wanted = ("SandboxLeased", "SandboxStarted", "SandboxExited", "SandboxDiscarded")
        types = [e.type_name for e in journal.entries(types=wanted)]
        commands = [e.event.command for e in journal.entries(types=("SandboxStarted",))]
    runs = [c for c in commands if CANARY not in c]
    assert len(runs) == 4
    assert types.count("SandboxLeased") == types.count("SandboxDiscarded") == len(commands)


def test_cli_run_refuses_a_malformed_egress_destination(cli_env: dict[str, str]) -> None:
    r = _charter("sandbox", "run", "--egress", "api.example.com,not a host!!", "--",
                 "/bin/true", env=cli_env, check_rc=2)  # fmt: skip
    assert "--egress" in r.stderr
    assert "egress destination" in r.stderr
    # Control: the grant's vocabulary, patterns included, is accepted and the command runs.
    _charter("sandbox", "run", "--egress", "*.example.com,api.example.org:8443", "--",
             "/bin/true", env=cli_env, check_rc=0)  # fmt: skip
    with Journal.open(cli_env["CHARTER_DB"]) as journal:
        leases = [e.event for e in journal.entries(types=("SandboxLeased",))]
    assert [lease.egress for lease in leases] == [("*.example.com", "api.example.org:8443")]  # type: ignore[attr-defined]


def test_cli_run_requires_a_journal(tmp_path: Path, state_dir: Path) -> None:
    env = {"CHARTER_DB": f"sqlite:///{tmp_path}/none.db", "CHARTER_SANDBOX_STATE": str(state_dir)}
    r = _charter("sandbox", "run", "--", "/bin/true", env=env, check_rc=1)
    assert "charter init" in r.stderr


def test_cli_probe_and_refusal(cli_env: dict[str, str], scratch: Path) -> None:
    r = _charter("--json", "sandbox", "probe", env=cli_env, check_rc=0)
    assert json.loads(r.stdout)["ok"] is True
    weak = {**cli_env, "CHARTER_BWRAP": _weak_bwrap(scratch, "--clearenv", 0)}
    r = _charter("--json", "sandbox", "probe", env=weak, check_rc=4)
    assert json.loads(r.stdout)["ok"] is False
    # Spawning is refused (exit 4, journaled) and the command never runs.
    scratch.chmod(0o777)
    _charter("sandbox", "run", "--workspace", str(scratch), "--", "/bin/sh", "-c",
             "touch /workspace/ran", env=weak, check_rc=4)  # fmt: skip
    assert not (scratch / "ran").exists()
    with Journal.open(cli_env["CHARTER_DB"]) as journal:
        refusals = list(journal.entries(types=("SandboxProbeRefused",)))
        started = [e.event for e in journal.entries(types=("SandboxStarted",))]
    assert len(refusals) == 2
    assert "environment_cleared" in refusals[0].event.failed  # type: ignore[attr-defined]
    assert started  # the canaries are journaled ...
    assert _canary_only(started)  # ... and nothing but them ever started


def test_cli_spec_renders_without_running(tmp_path: Path) -> None:
    env = {"CHARTER_DB": f"sqlite:///{tmp_path}/none.db"}
    argv = json.loads(
        _charter("--json", "sandbox", "spec", "--format", "bwrap", env=env, check_rc=0).stdout
    )
    assert argv[0] == "bwrap"
    assert "--clearenv" in argv
    oci = json.loads(
        _charter("--json", "sandbox", "spec", "--format", "oci", env=env, check_rc=0).stdout
    )
    assert oci["ociVersion"] == "1.0.2"
    spec = json.loads(
        _charter(
            "sandbox",
            "spec",
            "--budget",
            "tokens=0,wall=10s,cpu=5s,mem=256MiB,egress=0MB",
            env=env,
            check_rc=0,
        ).stdout
    )
    assert spec["cgroup"]["cpu/cpu.cfs_quota_us"] == "50000"
    r = _charter("sandbox", "spec", "--budget", "nonsense", env=env)
    assert r.returncode == 2  # bad input is a usage error
