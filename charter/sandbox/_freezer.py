"""Pause and throttle a live sandbox: its cgroup freezer, and its CPU quota.

Every sandbox is in its own freezer cgroup from its first instruction (the launcher
joins it with the other caps), so freezing it stops every process it has, forks
included, with no race against a fork. A frozen sandbox's wall clock still runs (the
launcher's deadline is monotonic time, not the sandbox's CPU), and so does its lease's
expiry. Killing a frozen sandbox thaws it after the SIGKILLs (``Cgroup.kill_all``), since
a frozen task dies only once thawed.
"""

from __future__ import annotations

import time
from pathlib import Path

from charter.sandbox._cgroup import cgroup_dirs, controller_dir, freeze_dirs, read_int, read_text
from charter.sandbox.errors import SandboxUnavailableError
from charter.sandbox.spec import CgroupMode, SandboxSpec

__all__ = ["FREEZE_TIMEOUT", "SandboxControl"]

FREEZE_TIMEOUT = 1.0
"""How long a freeze may take before it is reported as failed (the caller then kills)."""

_MIN_QUOTA_US = 1000  # the kernel's floor for cfs_quota_us


class SandboxControl:
    """The supervision levers of one live sandbox, found by its spec: freeze and thaw,
    lower and restore its CPU quota. Raises :class:`SandboxUnavailableError` when the
    sandbox's cgroup is gone or the host refuses (fail closed: a pause that cannot be
    made is an error for the caller to act on, never a silent no-op)."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.mode = spec.cgroup_mode
        self.dirs = cgroup_dirs(self.mode, spec.cgroup_name)

    def _dir(self, controller: str) -> Path:
        return controller_dir(self.mode, self.dirs, controller)

    # -- pause ---------------------------------------------------------------------------

    def frozen(self) -> bool:
        """Whether the sandbox is frozen (every task of it stopped)."""
        match self.mode:
            case CgroupMode.V1:
                state = self._state()
                return state == "FROZEN"
            case CgroupMode.V2:
                return read_int(self._dir("") / "cgroup.events", "frozen") == 1

    def _state(self) -> str:
        try:
            return read_text(self._dir("freezer") / "freezer.state").strip()
        except OSError as e:
            raise SandboxUnavailableError(
                f"sandbox {self.spec.sandbox_id}: no freezer cgroup: {e}"
            ) from e

    def ask_freeze(self) -> None:
        """Ask the kernel to freeze the sandbox without waiting for it (a cascade asks
        every sandbox first, then waits for them all: :meth:`freeze` is both)."""
        try:
            freeze_dirs(self.mode, self.dirs, frozen=True)
        except OSError as e:
            raise SandboxUnavailableError(
                f"sandbox {self.spec.sandbox_id} cannot be frozen: {e}"
            ) from e

    def freeze(self, timeout: float = FREEZE_TIMEOUT) -> float:
        """Freeze the sandbox and wait until every task of it is frozen; returns the
        seconds it took. Raises when it is not frozen within ``timeout``."""
        start = time.monotonic()
        self.ask_freeze()
        delay = 0.0001
        while not self.frozen():
            if time.monotonic() - start > timeout:
                raise SandboxUnavailableError(
                    f"sandbox {self.spec.sandbox_id} was not frozen within {timeout} s"
                )
            # FREEZING: the kernel is still stopping tasks (a few per tick at worst).
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        return time.monotonic() - start

    def members(self) -> list[int]:
        """The processes of the sandbox's freezer cgroup (v2: its one cgroup); read while
        it is frozen, the list is whole: none of them can fork. Raises when the cgroup
        is gone."""
        path = self._dir("freezer" if self.mode is CgroupMode.V1 else "") / "cgroup.procs"
        try:
            return [int(x) for x in read_text(path).split()]
        except OSError as e:
            raise SandboxUnavailableError(
                f"sandbox {self.spec.sandbox_id}: its cgroup cannot be read: {e}"
            ) from e

    def thaw(self) -> None:
        """Let a frozen sandbox run again (a no-op on one that is not frozen)."""
        try:
            freeze_dirs(self.mode, self.dirs, frozen=False)
        except OSError as e:
            raise SandboxUnavailableError(
                f"sandbox {self.spec.sandbox_id} cannot be thawed: {e}"
            ) from e

    # -- throttle ------------------------------------------------------------------------

    def cpu_quota_us(self) -> int:
        """The CPU quota in force, in µs per ``spec.cpu_period_us``."""
        match self.mode:
            case CgroupMode.V1:
                return read_int(self._dir("cpu") / "cpu.cfs_quota_us")
            case CgroupMode.V2:
                return read_int(self._dir("") / "cpu.max")

    def _write_quota(self, quota_us: int) -> None:
        match self.mode:
            case CgroupMode.V1:
                path, value = self._dir("cpu") / "cpu.cfs_quota_us", str(quota_us)
            case CgroupMode.V2:
                path, value = self._dir("") / "cpu.max", f"{quota_us} {self.spec.cpu_period_us}"
        try:
            path.write_text(value)
        except OSError as e:
            raise SandboxUnavailableError(
                f"sandbox {self.spec.sandbox_id}: cannot set its CPU quota: {e}"
            ) from e

    def throttle(self, quota_permille: int) -> int:
        """Lower the CPU quota to ``quota_permille`` thousandths of a core (never above
        the spec's own quota, never below the kernel's 1 ms); returns the quota set."""
        wanted = self.spec.cpu_period_us * quota_permille // 1000
        quota = max(_MIN_QUOTA_US, min(self.spec.cpu_quota_us, wanted))
        self._write_quota(quota)
        return quota

    def restore(self) -> None:
        """Put the spec's CPU quota back (the end of a throttle)."""
        self._write_quota(self.spec.cpu_quota_us)
