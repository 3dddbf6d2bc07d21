"""Housekeeping: removing, off the critical path, the empty directories a finished
sandbox leaves (its cgroups), and sweeping the broker sockets of launchers that died
without closing them. Only ever given things no process uses."""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import re
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from charter.sandbox._host import uid_lock_dir

__all__ = ["SOCKET_NAME", "defer", "drain", "socket_name", "sweep_orphans", "sweep_sockets"]

SOCKET_NAME = re.compile(
    r"^(?P<kind>[a-z]+)-(?:(?P<owner>[A-Za-z0-9._-]+)-)?(?P<pid>[1-9][0-9]{0,9})\.sock$"
)
"""The one naming rule for the sockets in the sandbox state directory: ``KIND-PID.sock``
or ``KIND-OWNER-PID.sock`` (:func:`socket_name`), the pid being the process that serves
it, always last: a launcher's broker (``egress-4242.sock``), a cell's door and broker
(``door-CELL-4242.sock``, ``egress-CELL-4242.sock``; a cell's name may hold ``-`` and
digits). A sweep removes such a socket only when its process is gone *and* nothing
listens on it (a connect is refused): a live server's socket whose name merely looks
like one (``door-test-12345678.sock``, a test's random hex that happens to be all
digits) is never removed."""


def socket_name(kind: str, pid: int, owner: str = "") -> str:
    """The name of a socket served by process ``pid`` (see :data:`SOCKET_NAME`)."""
    name = f"{kind}-{owner}-{pid}.sock" if owner else f"{kind}-{pid}.sock"
    if SOCKET_NAME.match(name) is None:
        raise ValueError(f"{name!r} does not follow the state directory's naming rule")
    return name


_tasks: queue.Queue[Callable[[], None]] = queue.Queue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def _work() -> None:
    while True:
        task = _tasks.get()
        try:
            with contextlib.suppress(Exception):  # housekeeping: a stale cgroup is reaped later
                task()
        finally:
            _tasks.task_done()


def defer(task: Callable[[], None]) -> None:
    """Run ``task`` soon on the janitor thread."""
    global _thread  # noqa: PLW0603 (one janitor per process, started on first use)
    with _started:
        if _thread is None:
            _thread = threading.Thread(target=_work, daemon=True, name="sandbox-janitor")
            _thread.start()
    _tasks.put(task)


def drain() -> None:
    """Wait until every deferred task has run (tests, and at interpreter exit)."""
    if _thread is not None:
        _tasks.join()


atexit.register(drain)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listened(path: Path) -> bool:
    """Whether a server listens on the unix socket ``path``: only a refused connect
    (ECONNREFUSED: no socket is bound to it) says no; anything else (accepted, a full
    backlog, a timeout) is taken as yes, so a doubt keeps the file."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return False
        except FileNotFoundError:
            return False
        except OSError:
            return True
    return True


def sweep_sockets(state_dir: Path) -> int:
    """Remove the sockets in ``state_dir`` named by :data:`SOCKET_NAME` whose process is
    gone and on which nothing listens (a SIGKILLed launcher or cell never closes its
    broker or door); returns how many. A live process with the same pid keeps its
    socket (a reused pid errs on the side of keeping a file), and so does a socket a
    server still listens on, whatever its name says."""
    removed = 0
    try:
        names = os.listdir(state_dir)
    except FileNotFoundError:
        return 0
    for name in names:
        match = SOCKET_NAME.match(name)
        if match is None or _alive(int(match["pid"])):
            continue
        path = state_dir / name
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode) and not _listened(path):
                os.unlink(path)
                removed += 1
    return removed


_GRACE_S = 60.0
"""A slot or workspace directory younger than this may belong to a sandbox being set up
(its directory is made a moment before its uid record names it): never swept."""


def sweep_orphans(state_dir: Path, kind: str, remove: Callable[[Path], None]) -> int:
    """Remove with ``remove`` the per-sandbox directories ``state_dir/kind/ID`` (warm-pool
    slot mount points, persistent workspaces' overlays) that no uid record names any
    more: their launcher died (SIGKILLed) and the uid reaper has killed their sandboxes.
    Call it after that reaper; returns how many."""
    parent = state_dir / kind
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return 0
    live: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        for lock in uid_lock_dir(state_dir).iterdir():
            with contextlib.suppress(OSError):
                live.update(re.findall(r"charter-sbx-([a-z0-9-]+)", lock.read_text()))
    removed = 0
    for name in names:
        if name in live:
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or in use: left for later
            if time.time() - os.lstat(parent / name).st_mtime > _GRACE_S:
                remove(parent / name)
                removed += 1
    return removed
