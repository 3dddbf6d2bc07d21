"""Host discovery and allocation: the impure side that produces :class:`HostFacts` inputs."""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

from charter.sandbox.errors import SandboxUnavailableError, UidPoolExhaustedError
from charter.sandbox.spec import FIRST_SANDBOX_UID, CgroupMode

__all__ = [
    "CGROUP_ROOT",
    "UidLease",
    "allocate_uid",
    "hold_uid",
    "uid_lock_dir",
    "cgroup_mode",
    "default_state_dir",
    "find_bwrap",
    "own_cgroups",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
_MARK_MAX = 4096
UID_RANGE = 1000
"""Host uids FIRST_SANDBOX_UID .. FIRST_SANDBOX_UID+UID_RANGE-1 are reserved for sandboxes."""


def default_state_dir() -> Path:
    """Where uid locks, slot mount points and broker sockets live (root-owned)."""
    return Path(os.environ.get("CHARTER_SANDBOX_STATE", "/run/charter-sandbox"))


def find_bwrap() -> str:
    path = os.environ.get("CHARTER_BWRAP") or shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailableError(
            "bubblewrap is not installed: run scripts/setup (apt-get install bubblewrap)"
        )
    return path


def cgroup_mode(mounts: str | None = None) -> CgroupMode:
    """v2 when /sys/fs/cgroup itself is a cgroup2 mount; else v1 (``unified`` is ignored)."""
    text = mounts if mounts is not None else Path("/proc/self/mounts").read_text()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == str(CGROUP_ROOT):
            return CgroupMode.V2 if fields[2] == "cgroup2" else CgroupMode.V1
    raise SandboxUnavailableError("no cgroup file system is mounted at /sys/fs/cgroup")


def own_cgroups(text: str | None = None) -> dict[str, str]:
    """This process's cgroup path per v1 controller (key ``""`` for the v2 path)."""
    text = text if text is not None else Path("/proc/self/cgroup").read_text()
    paths: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            paths[controller] = path
    return paths


class UidLease:
    """An unprivileged host uid held (by an flock) for one live sandbox.

    The lock file also names the sandbox's cgroup directories while it runs
    (:meth:`mark`), and is emptied when the lease is released, after the sandbox's last
    process is gone. A holder that dies (a SIGKILLed launcher) drops the flock but not
    that content: whoever takes the uid next finds the cgroups of a sandbox nobody
    supervises in :attr:`stale`, and must empty them before the uid is used again (see
    ``_cgroup.settle``): otherwise a survivor would share its uid with the next sandbox
    (its egress grant, its key handles, its processes)."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd: int | None = fd
        self._marked = False
        text = os.pread(fd, _MARK_MAX, 0).decode(errors="replace")
        self.stale: tuple[str, ...] = tuple(line for line in text.splitlines() if line)

    def mark(self, cgroup_dirs: Sequence[str]) -> None:
        """Record the sandbox's cgroup directories (before they are made)."""
        if self._fd is None:
            raise SandboxUnavailableError(f"uid {self.uid} was released")
        data = "".join(f"{d}\n" for d in cgroup_dirs).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        self._marked = True

    def clear(self) -> None:
        """Forget the recorded (or stale) cgroups: none of their processes remain."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
        self._marked = False
        self.stale = ()

    def release(self) -> None:
        """Give the uid back; call it once no process of the sandbox remains. A stale
        record that was not cleared stays for the next holder."""
        if self._fd is not None:
            if self._marked:
                os.ftruncate(self._fd, 0)
                self._marked = False
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> UidLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_cursor = secrets.randbelow(UID_RANGE)
_cursor_lock = threading.Lock()
_lock_dirs: set[str] = set()


def uid_lock_dir(state_dir: Path) -> Path:
    """One lock file per sandbox uid (named by the uid), flocked while it is held."""
    return state_dir / "uids"


def hold_uid(state_dir: Path, uid: int) -> UidLease | None:
    """Hold sandbox uid ``uid`` if no live holder has it (its flock is free), else None.
    Recovery kills what a dead holder left running under a uid only while holding it:
    a uid another holder has taken since belongs to that holder's sandbox."""
    if not FIRST_SANDBOX_UID <= uid < FIRST_SANDBOX_UID + UID_RANGE:
        raise SandboxUnavailableError(f"uid {uid} is not a sandbox uid")
    locks = uid_lock_dir(state_dir)
    locks.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(f"{locks}/{uid}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return UidLease(uid, fd)


def allocate_uid(state_dir: Path) -> UidLease:
    """Hold the first free sandbox uid. The flock is released by :meth:`UidLease.release`
    or when the holding process dies, so uids never leak past their holder. The lease's
    ``stale`` names cgroups a dead holder left running: settle them before use."""
    locks = uid_lock_dir(state_dir)
    if str(locks) not in _lock_dirs:
        locks.mkdir(parents=True, exist_ok=True, mode=0o700)
        _lock_dirs.add(str(locks))
    global _cursor  # noqa: PLW0603 (one cursor per process, guarded by the lock)
    with _cursor_lock:
        start = _cursor
        _cursor = (_cursor + 1) % UID_RANGE
    # Round-robin from a per-process random start: a uid just released is not handed out
    # again at once, so the last zombies of its previous sandbox (reaped by the host's
    # init) never count against the next sandbox's RLIMIT_NPROC.
    for offset in range(UID_RANGE):
        uid = FIRST_SANDBOX_UID + (start + offset) % UID_RANGE
        fd = os.open(f"{locks}/{uid}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        with _cursor_lock:
            _cursor = (uid - FIRST_SANDBOX_UID + 1) % UID_RANGE
        return UidLease(uid, fd)
    raise UidPoolExhaustedError(
        f"all {UID_RANGE} sandbox host uids are held by live sandboxes; wait for one to end"
    )
