"""Fail closed: a live canary sandbox, through the real renderer and launcher, must show
every isolation property, or spawning is refused. There is no weaker fallback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from charter.core.budget import Budget
from charter.sandbox._canary import CANARY
from charter.sandbox._host import default_state_dir, find_bwrap
from charter.sandbox._launch import EventSink, RawLauncher
from charter.sandbox.errors import HostCannotIsolateError
from charter.sandbox.events import SandboxProbeRefused
from charter.sandbox.spec import NOFILE

__all__ = ["PROBE_BUDGET", "ProbeCheck", "ProbeReport", "probe", "refuse", "require_isolation"]

PROBE_BUDGET = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=0MB")
_CANARY_PYTHON = "/usr/bin/python3"
_NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")


class ProbeCheck(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    ok: bool
    detail: str


class ProbeReport(BaseModel):
    """The ``--json`` payload of ``charter sandbox probe``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    checks: tuple[ProbeCheck, ...]

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks if not c.ok)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _static_checks(bwrap: str) -> list[ProbeCheck]:
    checks = []
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=False)
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", version.stdout)
    ok = m is not None and tuple(int(x) for x in m.groups()) >= (0, 8, 0)
    checks.append(ProbeCheck(name="bwrap_version", ok=ok, detail=version.stdout.strip() or "none"))
    userns = _read("/proc/sys/user/max_user_namespaces")
    checks.append(
        ProbeCheck(name="user_namespaces", ok=userns is not None and int(userns) > 0,
                   detail=f"user.max_user_namespaces={userns}")
    )  # fmt: skip
    apparmor = _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    checks.append(
        ProbeCheck(name="apparmor_userns", ok=apparmor in (None, "0"),
                   detail=f"apparmor_restrict_unprivileged_userns={apparmor}")
    )  # fmt: skip
    actions = _read("/proc/sys/kernel/seccomp/actions_avail") or ""
    checks.append(ProbeCheck(name="seccomp", ok="errno" in actions.split(), detail=actions))
    filesystems = _read("/proc/filesystems") or ""
    checks.append(
        ProbeCheck(name="overlayfs", ok="overlay" in filesystems.split(), detail="overlay")
    )
    return checks


def _live_checks(launcher: RawLauncher) -> list[ProbeCheck]:
    canary_env = "CHARTER_PROBE_CANARY_" + secrets.token_hex(4).upper()
    ws = Path(tempfile.mkdtemp(prefix="charter-probe-"))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # The canary is handed a terminal as stdin (a fresh pty): the launcher must not let
    # it reach the sandbox.
    terminal, terminal_slave = os.openpty()
    os.environ[canary_env] = "leaked"
    try:
        os.chmod(ws, 0o777)  # noqa: S103 (the canary's own scratch workspace)
        (ws / "secret").write_text("root only\n")
        os.chmod(ws / "secret", 0o600)
        (ws / "public").write_text("anyone\n")
        os.chmod(ws / "public", 0o644)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        host_ns = [f"{n}={os.stat(f'/proc/self/ns/{n}').st_ino}" for n in _NAMESPACES]
        spec_pids = 16  # compile_spec(PROBE_BUDGET) gives pids.max = 16 (64 MiB / 4 MiB)
        outcome = launcher.run(
            PROBE_BUDGET,
            [_CANARY_PYTHON, "-I", "-c", CANARY, str(port), canary_env, str(os.getsid(0)),
             str(spec_pids), str(PROBE_BUDGET.mem_bytes), *host_ns],
            workspace=ws, capture=True, stdin=terminal_slave,
        )  # fmt: skip
        canary_owner = (ws / "canary").stat().st_uid if (ws / "canary").exists() else None
    finally:
        os.environ.pop(canary_env, None)
        listener.close()
        os.close(terminal)
        os.close(terminal_slave)
        for name in ("secret", "public", "canary"):
            with contextlib.suppress(FileNotFoundError):
                (ws / name).unlink()
        with contextlib.suppress(OSError):
            ws.rmdir()
    if outcome.exit_code != 0 or not outcome.stdout:
        err = (outcome.stderr or b"").decode(errors="replace")[-400:]
        return [ProbeCheck(name="canary_ran", ok=False, detail=f"exit {outcome.exit_code}: {err}")]
    f = json.loads(outcome.stdout)
    w = f["write"]
    allowed_env = {"PATH", "HOME", "TMPDIR", "LANG", "PWD"}
    allowed_env |= {"CHARTER_EGRESS_SOCKET", "CHARTER_KEY_SOCKET"}
    outside = ("/x", "/usr/x", "/etc/x", "/dev/x", "/proc/x")
    root_only, public = f["read_secret"], f["read_public"]
    tmp, shm, stopped = f["tmp_bytes"], f["shm_bytes"], f["fork_stopped_at"]
    fam = f["socket_families"]
    return [
        ProbeCheck(name="canary_ran", ok=True, detail=f"sandbox {outcome.sandbox_id}"),
        ProbeCheck(name="unprivileged_host_uid", ok=canary_owner not in (None, 0),
                   detail=f"workspace file owned by host uid {canary_owner}"),
        ProbeCheck(name="root_only_file_unreadable",
                   ok=root_only == "EACCES" and public == "allowed",
                   detail=f"root-only file: {root_only}, public: {public}"),
        ProbeCheck(name="read_only_root",
                   ok=all(w[p] != "allowed" for p in outside),
                   detail=json.dumps({k: v for k, v in w.items() if "workspace" not in k})),
        ProbeCheck(name="one_writable_workspace",
                   ok=w["/workspace/canary"] == "allowed", detail=w["/workspace/canary"]),
        ProbeCheck(name="workspace_nosuid_nodev",
                   ok={"nosuid", "nodev"} <= set(f["workspace_opts"].split(",")),
                   detail=f"/workspace mounted {f['workspace_opts'] or 'nowhere'}"),
        ProbeCheck(name="tmpfs_capped",
                   ok=0 < tmp <= PROBE_BUDGET.mem_bytes and 0 < shm <= tmp,
                   detail=f"tmp {tmp} B, shm {shm} B"),
        ProbeCheck(name="environment_cleared",
                   ok=not f["env_canary"] and set(f["env"]) <= allowed_env,
                   detail=",".join(f["env"])),
        ProbeCheck(name="init_environment_clean",
                   ok="1" in f["environ_pids"] and not f["environ_canary"],
                   detail=f"environ of pids {','.join(f['environ_pids'])} checked; host "
                          f"variable in: {','.join(f['environ_canary']) or 'none'}"),
        ProbeCheck(name="init_process_hidden", ok=f["init_mem"] != "allowed",
                   detail=f"open /proc/1/mem (bwrap's init) for writing: {f['init_mem']}"),
        ProbeCheck(name="no_host_home", ok=not f["home_visible"],
                   detail=",".join(f["home_visible"]) or "none visible"),
        ProbeCheck(name="no_host_loopback", ok=f["tcp_host_loopback"] != "allowed",
                   detail=f["tcp_host_loopback"]),
        ProbeCheck(name="only_loopback_interface", ok=f["interfaces"] == ["lo"],
                   detail=",".join(f["interfaces"])),
        ProbeCheck(name="socket_families_allow_listed",
                   ok=all(v == "allowed" for k, v in fam.items() if k in ("unix", "inet"))
                   and all(v == "EAFNOSUPPORT" for k, v in fam.items()
                           if k in ("vsock", "netlink", "packet")),
                   detail=json.dumps(fam)),
        ProbeCheck(name="no_name_resolution", ok=f["resolve"] != "allowed", detail=f["resolve"]),
        ProbeCheck(name="no_nested_userns", ok=f["unshare_user"] != "allowed",
                   detail=f["unshare_user"]),
        ProbeCheck(name="no_mount", ok=f["mount"] != "allowed", detail=f["mount"]),
        ProbeCheck(name="no_ptrace", ok=f["ptrace_attach"] != "allowed",
                   detail=f["ptrace_attach"]),
        ProbeCheck(name="parent_death_signal_kept", ok=f["clear_pdeathsig"] != "allowed",
                   detail=f"prctl(PR_SET_PDEATHSIG, 0): {f['clear_pdeathsig']}"),
        ProbeCheck(name="rlimits_final",
                   ok=f["rlimit_raise"] != "allowed" and f["core_soft"] == 0
                   and 0 < f["nofile"][0] <= NOFILE,
                   detail=f"raise NOFILE soft to hard: {f['rlimit_raise']}; NOFILE "
                          f"{f['nofile']}, CORE soft {f['core_soft']}"),
        ProbeCheck(name="no_new_privs", ok=f["no_new_privs"] == "1", detail=f["no_new_privs"]),
        ProbeCheck(name="seccomp_filter", ok=f["seccomp"] == "2", detail=f["seccomp"]),
        ProbeCheck(name="no_capabilities",
                   ok=int(f["cap_eff"], 16) == 0 and int(f["cap_bnd"], 16) == 0,
                   detail=f"CapEff {f['cap_eff']} CapBnd {f['cap_bnd']}"),
        ProbeCheck(name="all_namespaces_unshared", ok=not f["ns_shared"],
                   detail="shared: " + (",".join(f["ns_shared"]) or "none")),
        ProbeCheck(name="new_session", ok=f["sid_differs"], detail=str(f["sid_differs"])),
        ProbeCheck(name="no_terminal", ok=f["terminal_fds"] == [],
                   detail=f"terminal fds given a terminal stdin: {f['terminal_fds'] or 'none'}"),
        ProbeCheck(name="pids_cap", ok=stopped is not None and stopped < spec_pids,
                   detail=f"fork refused after {stopped} children (pids.max {spec_pids})"),
        ProbeCheck(name="memory_cap", ok=f["memory_hog_rc"] == -9,
                   detail=f"hog over {PROBE_BUDGET.mem_bytes} B ended with {f['memory_hog_rc']}"),
    ]  # fmt: skip


def probe(
    sink: EventSink | None = None, *, state_dir: Path | None = None, bwrap: str | None = None
) -> ProbeReport:
    """Run every check and report (never raises for a failed check: any error is a
    failure). The canary sandbox is journaled through ``sink`` like any other."""
    checks: list[ProbeCheck] = []
    try:
        path = bwrap or find_bwrap()
        checks += _static_checks(path)
        launcher = RawLauncher(sink, state_dir=state_dir or default_state_dir(), bwrap=path)
        checks += _live_checks(launcher)
    except Exception as e:  # noqa: BLE001 (fail closed: any error at all is a refusal)
        failure = f"{type(e).__name__}: {e}"
        checks.append(ProbeCheck(name="probe_completed", ok=False, detail=failure))
    return ProbeReport(ok=bool(checks) and all(c.ok for c in checks), checks=tuple(checks))


def require_isolation(
    sink: EventSink | None = None, *, state_dir: Path | None = None, bwrap: str | None = None
) -> ProbeReport:
    """Probe; if the host cannot isolate, journal the refusal and raise (exit 4)."""
    report = probe(sink, state_dir=state_dir, bwrap=bwrap)
    if not report.ok:
        raise refuse(report, sink)
    return report


def refuse(report: ProbeReport, sink: EventSink | None) -> HostCannotIsolateError:
    """The refusal for a failed ``report``: journaled through ``sink`` (when there is
    one) as SandboxProbeRefused, and returned as the error to raise (exit 4)."""
    detail = "; ".join(f"{c.name}: {c.detail}" for c in report.checks if not c.ok)
    if sink is not None:
        sink.append([SandboxProbeRefused(failed=report.failed, detail=detail[:2000])])
    return HostCannotIsolateError(
        f"this host cannot isolate sandboxes, so spawning is refused ({detail})"
    )
