"""The fail-closed gate in front of every spawn: a probe pass, remembered for one boot."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from charter.sandbox._host import default_state_dir, find_bwrap
from charter.sandbox._launch import EventSink
from charter.sandbox.errors import SandboxUnavailableError
from charter.sandbox.probe import ProbeCheck, ProbeReport, refuse, require_isolation

__all__ = ["ensure_isolation", "forget_pass"]

_PACKAGE = Path(__file__).parent
"""Every module under here is isolation code: a change to any of them re-probes."""


def _fingerprint(bwrap: str, package: Path | None = None) -> str:
    """What a remembered pass depends on: this boot, this bwrap binary, this code."""
    package = package or _PACKAGE
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    st = os.stat(bwrap)
    digest = hashlib.sha256(f"{boot}|{bwrap}|{st.st_size}|{st.st_mtime_ns}".encode())
    for path in sorted(package.rglob("*.py")):
        code = path.read_bytes()
        name = path.relative_to(package).as_posix().encode()
        digest.update(b"|%s|%d|" % (name, len(code)) + code)
    return digest.hexdigest()


def _marker(state_dir: Path) -> Path:
    return state_dir / "probe-pass"


def forget_pass(state_dir: Path | None = None) -> None:
    """Drop the remembered probe pass: the host failed to isolate since (its cgroups
    became unusable), so the next spawn probes again."""
    with contextlib.suppress(FileNotFoundError):
        _marker(state_dir or default_state_dir()).unlink()


def ensure_isolation(
    sink: EventSink | None = None, *, state_dir: Path | None = None, bwrap: str | None = None
) -> ProbeReport | None:
    """Probe unless a pass for this boot, bwrap and sandbox code is on record. Refuses
    (raises HostCannotIsolateError, journaled through ``sink``) when the host cannot
    isolate. Returns the fresh report, or None when a remembered pass was used."""
    state = state_dir or default_state_dir()
    try:
        bwrap = bwrap or find_bwrap()
    except SandboxUnavailableError as e:
        # No bubblewrap: the host cannot isolate, a refusal like any failed probe.
        missing = ProbeCheck(name="bwrap_installed", ok=False, detail=str(e))
        raise refuse(ProbeReport(ok=False, checks=(missing,)), sink) from e
    marker = _marker(state)
    try:
        fingerprint: str | None = _fingerprint(bwrap)
    except OSError:
        fingerprint = None  # nothing can be remembered (no such bwrap?): the probe says why
    if fingerprint is not None:
        try:
            if marker.read_text() == fingerprint:
                return None
        except OSError:
            pass  # no pass on record yet (a fresh state directory): probe, then remember
    # The canary's own lifecycle is journaled through ``sink`` too.
    report = require_isolation(sink, state_dir=state, bwrap=bwrap)
    if fingerprint is not None:
        state.mkdir(parents=True, exist_ok=True)
        # A reader racing this write sees a mismatch and probes again: safe, only slower.
        marker.write_text(fingerprint)
    return report
