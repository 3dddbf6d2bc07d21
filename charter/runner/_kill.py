"""Killing what is left of a sandbox: every process of its unique host uid."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence

from charter.sandbox import FREEZE_TIMEOUT, SandboxControl, SandboxUnavailableError

__all__ = ["freeze_then_kill", "kill_uid", "kill_uids"]


def kill_uid(uid: int) -> int:
    """SIGKILL every process on the host running as ``uid`` (a sandbox's unique host
    uid), again until none is left (a fork in between is caught by the next pass);
    return how many were signalled."""
    return kill_uids({uid})


def kill_uids(uids: set[int]) -> int:
    """:func:`kill_uid` for many sandboxes at once: each pass over the host's processes
    signals all of them (a cascade is one walk of /proc a pass, not one per sandbox)."""
    total = 0
    for _ in range(100):
        killed = _kill_pass(uids)
        total += killed
        if killed == 0:
            return total
        time.sleep(0.01)
    return total


def _kill_pass(uids: set[int]) -> int:
    """Signal every live process of ``uid``; a zombie (already dead, waiting for its
    parent to reap it) is not counted: counting it made every kill spin all 100 passes
    until its parent reaped it."""
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid not in uids:
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
            if state in (b"Z", b"X"):
                continue
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
    return killed


def freeze_then_kill(controls: Sequence[SandboxControl], uids: set[int]) -> int:
    """Kill many live sandboxes at once, frozen first: every one is asked to freeze,
    then waited for together (at most ``FREEZE_TIMEOUT`` in all), so none of them can
    fork or act between the first SIGKILL and the last; one pass signals every process
    of ``uids``, the sandboxes are thawed (a frozen task dies only once thawed), and
    :func:`kill_uids` then catches whatever is left. A sandbox that cannot be frozen
    (its cgroup gone, the host refusing) is killed all the same."""
    asked: list[SandboxControl] = []
    for control in controls:
        with contextlib.suppress(SandboxUnavailableError):
            control.ask_freeze()
            asked.append(control)
    deadline = time.monotonic() + FREEZE_TIMEOUT
    for control in asked:
        with contextlib.suppress(SandboxUnavailableError):
            while not control.frozen() and time.monotonic() < deadline:
                time.sleep(0.001)
    total = _kill_pass(uids)
    for control in asked:
        with contextlib.suppress(SandboxUnavailableError):
            control.thaw()
    return total + kill_uids(uids)
