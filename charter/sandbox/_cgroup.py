"""Per-sandbox cgroups (v1 hierarchies or v2), nested under this process's own cgroup."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import select
import signal
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from charter.sandbox._host import CGROUP_ROOT, UidLease, own_cgroups, uid_lock_dir
from charter.sandbox.errors import HostCannotIsolateError, SandboxUnavailableError
from charter.sandbox.render import render_cgroup
from charter.sandbox.spec import CgroupMode, SandboxSpec

__all__ = [
    "Cgroup",
    "CgroupUsage",
    "cgroup_dirs",
    "controller_dir",
    "cpu_join_files",
    "freeze_dirs",
    "read_int",
    "read_text",
    "home_fds",
    "missing_hierarchies",
    "reap_cgroups",
    "reap_stale",
    "settle",
]

# freezer: every sandbox is in its own freezer cgroup from its first instruction, so a
# pause verdict freezes every process it has, forks included (_freezer.py).
_V1_CONTROLLERS = ("pids", "memory", "cpu", "cpuacct", "freezer")
_PARENT = "charter"


class CgroupUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu_ms: int
    memory_peak_bytes: int
    oom_kills: int
    pids_limit_hits: int


@functools.lru_cache(maxsize=2)
def _parent_dirs(mode: CgroupMode) -> list[Path]:
    """Where sandbox cgroups go: ``charter/`` under this process's own cgroups (read
    once: a launcher is not expected to be moved between cgroups while it runs)."""
    own = own_cgroups()
    match mode:
        case CgroupMode.V1:
            return [
                CGROUP_ROOT / c / own.get(c, "/").lstrip("/") / _PARENT for c in _V1_CONTROLLERS
            ]
        case CgroupMode.V2:
            return [CGROUP_ROOT / own.get("", "/").lstrip("/") / _PARENT]


def _join_file(mode: CgroupMode) -> str:
    match mode:
        case CgroupMode.V1:
            return "tasks"
        case CgroupMode.V2:
            return "cgroup.procs"


def missing_hierarchies(mounts: str | None = None) -> list[str]:
    """The v1 controllers a sandbox needs whose hierarchy is not mounted (from the text
    of ``/proc/self/mounts``; this process's own when None)."""
    text = mounts if mounts is not None else Path("/proc/self/mounts").read_text()
    mounted: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup":
            mounted.update(o for o in fields[3].split(",") if o in _V1_CONTROLLERS)
    return [c for c in _V1_CONTROLLERS if c not in mounted]


_made_parents: set[str] = set()
_home_lock = threading.Lock()
_home: dict[str, int] = {}


def home_fds() -> list[int]:
    """Join files of the calling thread's current v1 cgroups: call it *before* moving
    the thread, then write ``0`` to each to move it back. (Opened files are cached.)"""
    own = own_cgroups(Path("/proc/thread-self/cgroup").read_text())
    fds = []
    with _home_lock:
        for c in _V1_CONTROLLERS:
            path = str(CGROUP_ROOT / c / own.get(c, "/").lstrip("/") / "tasks")
            if path not in _home:
                _home[path] = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            fds.append(_home[path])
    return fds


def _read(path: Path) -> str:
    """One read of a small kernel file (cheaper than pathlib's buffered text I/O)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def read_text(path: Path) -> str:
    """One read of a small kernel file (raises OSError)."""
    return _read(path)


def read_int(path: Path, key: str | None = None) -> int:
    """The first number of a kernel file, or the value of ``key`` in a flat keyed file
    (``name value`` lines); 0 when it is missing or unreadable."""
    return _read_int(path, key)


def controller_dir(mode: CgroupMode, dirs: tuple[str, ...] | list[Path], controller: str) -> Path:
    """The directory of ``controller`` among a sandbox's cgroup ``dirs`` (as
    :func:`cgroup_dirs` names them); on v2, the one directory."""
    match mode:
        case CgroupMode.V1:
            return Path(dirs[_V1_CONTROLLERS.index(controller)])
        case CgroupMode.V2:
            return Path(dirs[0])


def freeze_dirs(mode: CgroupMode, dirs: tuple[str, ...] | list[Path], frozen: bool) -> None:
    """Ask the kernel to freeze (or thaw) a sandbox's cgroup (raises OSError; a v1
    freeze is done once ``freezer.state`` reads ``FROZEN``, see _freezer.py)."""
    match mode:
        case CgroupMode.V1:
            path, value = (
                controller_dir(mode, dirs, "freezer") / "freezer.state",
                (b"FROZEN" if frozen else b"THAWED"),
            )
        case CgroupMode.V2:
            path, value = Path(dirs[0]) / "cgroup.freeze", b"1" if frozen else b"0"
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


def _thaw_for_kill(mode: CgroupMode, dirs: tuple[str, ...] | list[Path]) -> None:
    """After SIGKILLs: a frozen task dies only once thawed (a missing cgroup is gone)."""
    with contextlib.suppress(OSError):
        freeze_dirs(mode, dirs, frozen=False)


def _read_int(path: Path, key: str | None = None) -> int:
    try:
        text = _read(path)
    except OSError:
        return 0
    if key is None:
        return int(text.split()[0]) if text.split() else 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


class Cgroup:
    """One sandbox's cgroup directories.

    ``join_fds`` are the opened files a task writes ``0`` to, to join. On v1 that is
    ``tasks``, which moves only the writing thread: the kernel then skips the global
    ``cgroup_threadgroup_rwsem`` write lock, whose RCU grace period cost 5-10 ms per
    launch here. A single-threaded child, or one thread of the launcher about to fork,
    is exactly what must move, so nothing is lost."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.mode = spec.cgroup_mode
        self.dirs = [p / spec.cgroup_name for p in _parent_dirs(self.mode)]
        self.join_fds: list[int] = []
        self._procs = self.dirs[0] / "cgroup.procs"
        try:
            for d in self.dirs:
                if str(d.parent) not in _made_parents:
                    d.parent.mkdir(exist_ok=True)
                    _made_parents.add(str(d.parent))
                d.mkdir()
            self.write_limits(spec)
            for d in self.dirs:
                self.join_fds.append(os.open(d / _join_file(self.mode), os.O_WRONLY | os.O_CLOEXEC))
        except OSError as e:
            with contextlib.suppress(SandboxUnavailableError):  # what exists is reaped later
                self.remove()
            # Without its cgroup caps a sandbox cannot run: the host cannot isolate now
            # (whatever a remembered probe pass said), a refusal like the probe's.
            missing = missing_hierarchies() if self.mode is CgroupMode.V1 else []
            lacks = (
                f"; the host lacks the cgroup v1 hierarchies {', '.join(missing)} (mount "
                f"each: mount -t cgroup -o NAME cgroup {CGROUP_ROOT}/NAME)"
                if missing
                else ""
            )
            raise HostCannotIsolateError(
                f"this host cannot isolate sandboxes now: the sandbox cgroup cannot be set "
                f"up ({e}){lacks}; run `charter sandbox probe` once the cgroups are usable again"
            ) from e

    def write_limits(self, spec: SandboxSpec) -> None:
        """Write ``spec``'s limits into the cgroup (raises OSError). In render order, so
        a lowered v1 memory limit is written before the memory+swap one that bounds it."""
        for key, value in render_cgroup(spec).items():
            fd = os.open(self._path(key), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)

    def _path(self, key: str) -> Path:
        match self.mode:
            case CgroupMode.V1:
                controller, _, name = key.partition("/")
                return self.dirs[_V1_CONTROLLERS.index(controller)] / name
            case CgroupMode.V2:
                return self.dirs[0] / key

    def close_join_fds(self) -> None:
        for fd in self.join_fds:
            os.close(fd)
        self.join_fds = []

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in _read(self._procs).split()]
        except OSError:
            return []

    def usage(self) -> CgroupUsage:
        match self.mode:
            case CgroupMode.V1:
                pids, memory, _, cpuacct, _ = self.dirs
                return CgroupUsage(
                    cpu_ms=_read_int(cpuacct / "cpuacct.usage") // 1_000_000,
                    memory_peak_bytes=_read_int(memory / "memory.max_usage_in_bytes"),
                    oom_kills=_read_int(memory / "memory.oom_control", "oom_kill"),
                    pids_limit_hits=_read_int(pids / "pids.events", "max"),
                )
            case CgroupMode.V2:
                d = self.dirs[0]
                return CgroupUsage(
                    cpu_ms=_read_int(d / "cpu.stat", "usage_usec") // 1000,
                    memory_peak_bytes=_read_int(d / "memory.peak"),
                    oom_kills=_read_int(d / "memory.events", "oom_kill"),
                    pids_limit_hits=_read_int(d / "pids.events", "max"),
                )

    def wait_empty(self, timeout: float = 0.5) -> bool:
        """Wait (briefly) for members to leave by themselves: bwrap reports the exit code
        a moment before its pid 1 is gone. Waits on pidfds, so it wakes at the exit.
        True when the cgroup emptied in time."""
        deadline = time.monotonic() + timeout
        while members := self.pids():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            fds = []
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    fds.append(os.pidfd_open(pid))
            try:
                poller = select.poll()
                for fd in fds:
                    poller.register(fd, select.POLLIN)
                # A pid may be reused by then; the timeout bounds that rare case.
                poller.poll(max(1, int(min(remaining, 0.05) * 1000)))
            finally:
                for fd in fds:
                    os.close(fd)
        return True

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every member until the cgroup is empty; True when it emptied in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            members = self.pids()
            if not members:
                return True
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _thaw_for_kill(self.mode, self.dirs)  # a paused sandbox dies too
            time.sleep(0.001)  # killed tasks leave the cgroup once the kernel reaps them
        return not self.pids()

    def remove(self) -> None:
        """Remove the directories (retrying while the last members are being reaped)."""
        self.close_join_fds()
        deadline = time.monotonic() + 5.0
        for d in reversed(self.dirs):
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise SandboxUnavailableError(f"cannot remove cgroup {d}: {e}") from e
                    self.kill_all(timeout=0.05)
                    time.sleep(0.0005)


def cpu_join_files(mode: CgroupMode, dirs: tuple[str, ...] | list[Path]) -> list[str]:
    """The membership files a process writes ``0`` to, to be charged to a sandbox's CPU
    accounting and throttled by its quota: on v1 the ``cpu`` and ``cpuacct``
    hierarchies' ``cgroup.procs`` only (not its memory, pids or freezer cgroups: a
    workspace copy-back joining them could be OOM-killed half-way by pages the
    sandbox left, or frozen by a late pause); on v2 its one cgroup, memory included."""
    match mode:
        case CgroupMode.V1:
            return [str(controller_dir(mode, dirs, c) / "cgroup.procs") for c in ("cpu", "cpuacct")]
        case CgroupMode.V2:
            return [str(Path(dirs[0]) / "cgroup.procs")]


def cgroup_dirs(mode: CgroupMode, name: str) -> tuple[str, ...]:
    """The directories :class:`Cgroup` makes for the sandbox cgroup ``name``."""
    return tuple(str(p / name) for p in _parent_dirs(mode))


def _is_sandbox_cgroup(path: Path) -> bool:
    return (
        path.is_absolute()
        and ".." not in path.parts
        and CGROUP_ROOT in path.parents
        and path.name.startswith("charter-sbx-")
    )


_REAP_TIMEOUT = 10.0


def reap_cgroups(dirs: tuple[str, ...], timeout: float = _REAP_TIMEOUT) -> bool:
    """SIGKILL every process in the sandbox cgroups ``dirs`` until none is left, then
    remove the directories. True when they emptied in time (only paths of sandbox
    cgroups under the cgroup root are touched)."""
    paths = [p for p in map(Path, dirs) if _is_sandbox_cgroup(p)]
    deadline = time.monotonic() + timeout
    while True:
        members: set[int] = set()
        for d in paths:
            with contextlib.suppress(FileNotFoundError):
                members.update(int(x) for x in _read(d / "cgroup.procs").split())
        if not members:
            break
        if time.monotonic() > deadline:
            return False
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for d in paths:  # a sandbox left frozen dies only once thawed (v1 or v2)
            for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                with contextlib.suppress(OSError):
                    if (d / name).exists():
                        (d / name).write_text(value)
        time.sleep(0.002)  # killed tasks leave the cgroup once they are reaped
    for d in reversed(paths):
        with contextlib.suppress(OSError):  # EBUSY a moment longer: reap_stale retries
            d.rmdir()
    return True


def settle(lease: UidLease) -> UidLease:
    """Make a freshly taken uid safe to use: if its last holder died while its sandbox
    ran (the lock file still names that sandbox's cgroups), kill what is left of that
    sandbox first, holding the uid meanwhile, so no survivor shares the uid with the
    next sandbox. Raises (the stale record kept) when they cannot be killed."""
    if lease.stale:
        if not reap_cgroups(lease.stale):
            raise SandboxUnavailableError(
                f"processes of an unsupervised sandbox of uid {lease.uid} survive SIGKILL"
            )
        lease.clear()
    return lease


def _reap_unsupervised(state_dir: Path) -> int:
    """Every sandbox uid whose holder died while its sandbox ran (a SIGKILLed launcher
    drops its flocks; its lock files still name the sandboxes' cgroups): take the uid,
    kill the sandbox's processes, remove its cgroups, give the uid back."""
    reaped = 0
    locks = uid_lock_dir(state_dir)
    try:
        names = [n for n in os.listdir(locks) if n.isdigit()]
    except FileNotFoundError:
        return 0
    for name in names:
        try:
            fd = os.open(locks / name, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: a live launcher supervises that sandbox
            continue
        lease = UidLease(int(name), fd)
        try:
            if lease.stale and reap_cgroups(lease.stale):
                lease.clear()
                reaped += 1
        finally:
            lease.release()
    return reaped


def reap_stale(mode: CgroupMode, state_dir: Path | None = None) -> int:
    """Kill the sandboxes of launchers that were SIGKILLed (found through the uid lock
    files of ``state_dir``), then remove empty cgroups they left; returns how many
    sandboxes and cgroups were cleaned up."""
    removed = _reap_unsupervised(state_dir) if state_dir is not None else 0
    for parent in _parent_dirs(mode):
        if not parent.is_dir():
            continue
        for d in parent.iterdir():
            if not d.name.startswith("charter-sbx-"):
                continue
            # Only old ones: a fresh, still-empty cgroup may belong to a launch in progress.
            # Another launcher may remove one between the listing and the stat.
            with contextlib.suppress(OSError):
                if time.time() - d.stat().st_mtime > 60:
                    d.rmdir()
                    removed += 1
    return removed
