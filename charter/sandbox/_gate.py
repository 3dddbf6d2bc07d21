"""The fail-closed gate in front of every spawn: a probe pass, remembered for one boot."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from charter.sandbox._host import default_state_dir, find_bwrap
from charter.sandbox.launcher import EventSink
from charter.sandbox.probe import ProbeReport, require_isolation

__all__ = ["ensure_isolation"]


def _fingerprint(bwrap: str) -> str:
    """What a remembered pass depends on: this boot, this bwrap binary, this code."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    st = os.stat(bwrap)
    code = Path(__file__).with_name("render.py").read_bytes()
    parts = f"{boot}|{bwrap}|{st.st_size}|{st.st_mtime_ns}|".encode() + code
    return hashlib.sha256(parts).hexdigest()


def ensure_isolation(
    sink: EventSink | None = None, *, state_dir: Path | None = None, bwrap: str | None = None
) -> ProbeReport | None:
    """Probe unless a pass for this boot, bwrap and renderer is on record. Refuses (raises
    HostCannotIsolateError, journaled through ``sink``) when the host cannot isolate.
    Returns the fresh report, or None when a remembered pass was used."""
    state = state_dir or default_state_dir()
    bwrap = bwrap or find_bwrap()
    marker = state / "probe-pass"
    try:
        fingerprint: str | None = _fingerprint(bwrap)
        if marker.read_text() == fingerprint:
            return None
    except OSError:
        fingerprint = None  # nothing remembered applies: probe (which will say why)
    report = require_isolation(sink, state_dir=state, bwrap=bwrap)
    if fingerprint is not None:
        state.mkdir(parents=True, exist_ok=True)
        marker.write_text(fingerprint)
    return report
