"""Killing what is left of a sandbox: every process of its unique host uid, or of its
frozen cgroup."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from charter.sandbox import FREEZE_TIMEOUT, SandboxControl, SandboxUnavailableError

__all__ = ["Freezing", "freeze_then_kill", "kill_uid", "kill_uids"]

_PARALLEL = 8  # threads of a cascade: the kernel does the work inside each cgroup write
_CHUNK = 32  # sandboxes per task


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


_DYING_NICE = -20  # a killed sandbox's teardown goes before the host's other work


def _kill_members(controls: Sequence[SandboxControl]) -> int:
    """SIGKILL every process of each frozen sandbox's cgroup (the list is whole: a
    frozen task cannot fork); a frozen task dies once thawed. Each is first given the
    highest priority: once thawed it runs no instruction of its own (its pending
    SIGKILL is taken first), only its exit, which then is not queued behind the rest
    of a busy host's work (the cell runs as root)."""
    killed = 0
    for control in controls:
        with contextlib.suppress(SandboxUnavailableError):
            for pid in control.members():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.setpriority(os.PRIO_PROCESS, pid, _DYING_NICE)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
    return killed


def _in_parallel(
    pool: ThreadPoolExecutor, act: Callable[[Sequence[SandboxControl]], object],
    controls: Sequence[SandboxControl],
) -> list[object]:  # fmt: skip
    """``act`` over ``controls`` in chunks on ``pool``; the results, once every chunk is
    done."""
    chunks = [controls[i : i + _CHUNK] for i in range(0, len(controls), _CHUNK)]
    return list(pool.map(act, chunks))


def _ask_freeze(controls: Sequence[SandboxControl]) -> list[SandboxControl]:
    asked = []
    for control in controls:
        with contextlib.suppress(SandboxUnavailableError):
            control.ask_freeze()
            asked.append(control)
    return asked


def _thaw(controls: Sequence[SandboxControl]) -> None:
    for control in controls:
        with contextlib.suppress(SandboxUnavailableError):
            control.thaw()


def _frozen(control: SandboxControl, deadline: float) -> bool:
    """Whether ``control``'s sandbox is frozen by ``deadline`` (False: not in time, or
    its cgroup is gone)."""
    try:
        while not control.frozen():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
    except SandboxUnavailableError:
        return False
    return True


def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, min(_PARALLEL, -(-n // _CHUNK))), "kill")


class Freezing:
    """Freezes asked of many sandboxes at once, on threads of their own, while the
    caller goes on (a revocation's sandboxes are asked to freeze while their kills are
    being journaled: the freeze is reversible, the kill waits for its commit)."""

    def __init__(self, controls: Sequence[SandboxControl]) -> None:
        self.controls = list(controls)
        self._pool = _pool(len(self.controls))
        chunks = [self.controls[i : i + _CHUNK] for i in range(0, len(self.controls), _CHUNK)]
        self._asked = [self._pool.submit(_ask_freeze, chunk) for chunk in chunks]
        self._pool.shutdown(wait=False)  # the threads end once the asks are done

    def asked(self) -> list[SandboxControl]:
        """Those asked (their cgroup took the freeze), once every ask is done."""
        return [c for future in self._asked for c in future.result()]


def freeze_then_kill(
    controls: Sequence[SandboxControl], uids: set[int], freezing: Freezing | None = None
) -> int:
    """Kill many live sandboxes at once, frozen first. Every one is asked to freeze,
    then waited for together (at most ``FREEZE_TIMEOUT`` in all), so none of them can
    fork or act between the first SIGKILL and the last; then every process of each
    frozen sandbox's cgroup is signalled and the sandboxes are thawed (a frozen task
    dies only once thawed). The cgroup writes (freeze, thaw) and the signals are spread
    over a few threads: the kernel's work is done inside each write, so a cascade of a
    thousand sandboxes is not a thousand writes in a row. A sandbox that cannot be
    frozen (its cgroup gone, the host refusing, not frozen in time) is killed all the
    same, by its host uid, again until no process of it is left. Returns how many
    processes were signalled. ``freezing``: the freezes already asked of some of them
    (:class:`Freezing`), not asked again."""
    if not controls:
        return 0
    pool = _pool(len(controls))
    try:
        early = freezing.asked() if freezing is not None else []
        done = {c.spec.sandbox_id for c in (freezing.controls if freezing is not None else ())}
        rest = [c for c in controls if c.spec.sandbox_id not in done]
        asked = [c for chunk in _in_parallel(pool, _ask_freeze, rest) for c in chunk]  # type: ignore[attr-defined]
        by_id = {c.spec.sandbox_id for c in controls}
        asked += [c for c in early if c.spec.sandbox_id in by_id]
        deadline = time.monotonic() + FREEZE_TIMEOUT
        frozen = [c for c in asked if _frozen(c, deadline)]
        killed = sum(_in_parallel(pool, _kill_members, frozen))  # type: ignore[arg-type]
        _in_parallel(pool, _thaw, frozen)
    finally:
        pool.shutdown(wait=False)  # every task is done: its threads end by themselves
    left = uids - {c.spec.host_uid for c in frozen}
    return killed + (kill_uids(left) if left else 0)
