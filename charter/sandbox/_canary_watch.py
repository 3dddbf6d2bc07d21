"""The host-side watch on a sandbox's decoy credential file: inotify ``IN_OPEN`` and
``IN_ACCESS`` on the very inode the sandbox opens.

A sandbox's ``/workspace`` is a bind of a host-side mount (a tmpfs, or an overlay over
a template or a persistent workspace): a bind shares the inode, so a watch added
through any path to that inode sees the sandbox's opens. The path used is
``/proc/<pid>/root/workspace/...`` of a process inside the sandbox: it names the inode
the sandbox sees whatever kind of workspace it has, even when the mount lives only in
the sandbox's private mount namespace (a warm-pool slot's overlay). A watch on a lower
layer's file would not do: overlayfs opens its real files without notifications.

The decoy is written (:func:`plant_decoy`) and watched before the sandbox runs any code
of its worker, so no path component can have been swapped for a symlink; every
component is still opened ``O_NOFOLLOW`` from the sandbox's root, as a matter of course,
and the watch is put on the inode held by a descriptor, not on a path through a pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from charter.sandbox._signals import sandbox_pid
from charter.sandbox._workspace import walk_dirs
from charter.sandbox.errors import SandboxUnavailableError
from charter.sandbox.spec import SandboxSpec

__all__ = ["OVERFLOW", "CanaryWatch", "Decoy", "DecoyTouch", "plant_decoy"]

_IN_ACCESS, _IN_OPEN = 0x00000001, 0x00000020
_IN_Q_OVERFLOW, _IN_IGNORED = 0x00004000, 0x00008000
_IN_DONT_FOLLOW, _IN_ONESHOT = 0x02000000, 0x80000000
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


OVERFLOW = "overflow"
"""The kind of the touch reported when the kernel's event queue overflowed (key ``""``):
events were lost, so any watched decoy may have been touched unseen. Fail closed: the
caller treats every sandbox it watches as possibly touched."""


class DecoyTouch(BaseModel):
    """The sandbox opened (``open``) or read (``access``) its decoy file; ``seen`` is the
    watcher's monotonic time when it read the event. Kind :data:`OVERFLOW`: see there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    kind: str
    seen: float


def _sandbox_root(spec: SandboxSpec) -> int:
    """An O_PATH descriptor of the sandbox's root, by a process inside it, checked to be
    the sandbox's still once it is open (a pid reused meanwhile names another root)."""
    pid = sandbox_pid(spec)
    if pid is None:
        raise SandboxUnavailableError(f"sandbox {spec.sandbox_id} has no process left")
    root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        still = f"/{spec.cgroup_name}\n" in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        still = False
    if not still:
        os.close(root)
        raise SandboxUnavailableError(f"sandbox {spec.sandbox_id}: its process went away")
    return root


class Decoy:
    """A planted decoy file, held by an ``O_PATH`` descriptor: :meth:`CanaryWatch.watch`
    watches that very inode (through ``/proc/self/fd``), whatever becomes of the path or
    the process it was reached by. :meth:`close` once it is watched."""

    def __init__(self, sandbox_id: str, relative: str, fd: int) -> None:
        self.sandbox_id = sandbox_id
        self.relative = relative
        self.fd = fd

    @property
    def path(self) -> Path:
        """The file, reached by its descriptor (valid until :meth:`close`)."""
        return Path(f"/proc/self/fd/{self.fd}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Decoy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def plant_decoy(spec: SandboxSpec, relative: str, text: str) -> Decoy:
    """Write the decoy file ``relative`` (a path under ``/workspace``) with ``text`` into
    the workspace of the sandbox ``spec`` describes, readable inside (0644). Call it
    before the worker runs (a parked warm-pool slot): the file must not exist, and no
    component is followed if it is a symlink."""
    parts = [p for p in relative.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise SandboxUnavailableError(f"decoy path {relative!r} is not a plain relative path")
    try:
        root = _sandbox_root(spec)
        try:
            ws = walk_dirs(root, ["workspace"])
        finally:
            os.close(root)
        try:
            parent = walk_dirs(ws, parts[:-1], make=True)
        finally:
            os.close(ws)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(parts[-1], flags, 0o644, dir_fd=parent)
            try:
                os.fchmod(fd, 0o644)  # not the host's umask
                os.write(fd, text.encode())
            finally:
                os.close(fd)
            held = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as e:
        raise SandboxUnavailableError(
            f"cannot plant the decoy in sandbox {spec.sandbox_id}: {e}"
        ) from e
    return Decoy(spec.sandbox_id, "/".join(parts), held)


class CanaryWatch:
    """One inotify instance and one thread reporting every open or read of a watched
    decoy file to ``on_touch`` (called on the watcher's thread: keep it short, e.g.
    append the verdict or queue it). An exception from ``on_touch`` never stops the
    watch: it is counted in :attr:`failures` (the last one kept in :attr:`last_failure`)
    and the next event is read. :meth:`close` ends the thread."""

    def __init__(self, on_touch: Callable[[DecoyTouch], None]) -> None:
        self._fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0:
            err = ctypes.get_errno()
            raise SandboxUnavailableError(f"inotify is unavailable: {os.strerror(err)}")
        self._on_touch = on_touch
        self._keys: dict[int, str] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._closed = False
        self.failures = 0
        self.last_failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="canary-watch", daemon=True)
        self._thread.start()

    def watch(self, key: str, target: Decoy | Path, *, once: bool = True) -> int:
        """Report opens and reads of ``target`` (a planted :class:`Decoy`, or a file's
        path, never followed if it is a symlink) as touches of ``key``; returns the watch
        descriptor (for :meth:`unwatch`). ``once``: the kernel drops the watch after its
        first event (one touch is the whole verdict, and a worker reading its decoy in a
        loop cannot flood the queue that every other sandbox's touches share)."""
        mask = _IN_OPEN | _IN_ACCESS | (_IN_ONESHOT if once else 0)
        if isinstance(target, Decoy):
            path = target.path  # the magic link to the held inode: followed
        else:
            path, mask = target, mask | _IN_DONT_FOLLOW
        wd = _libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise SandboxUnavailableError(f"cannot watch decoy {path}: {os.strerror(err)}")
        with self._lock:
            self._keys[wd] = key
        return int(wd)

    def unwatch(self, wd: int) -> None:
        """Stop reporting touches of one watch (a watch whose file is gone is gone)."""
        with self._lock:
            self._keys.pop(wd, None)
        _libc.inotify_rm_watch(self._fd, wd)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._closed:
            poller.poll()
            if self._closed:
                return
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                continue
            except OSError as e:
                if e.errno == errno.EBADF:
                    return
                raise
            seen = time.monotonic()
            for key, kind in self._touches(data):
                try:
                    self._on_touch(DecoyTouch(key=key, kind=kind, seen=seen))
                except Exception as e:  # noqa: BLE001 (the watch outlives a failed report)
                    self.failures += 1
                    self.last_failure = e

    def _touches(self, data: bytes) -> list[tuple[str, str]]:
        """(key, kind) of each touch in a buffer of inotify events."""
        found = []
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            if mask & _IN_Q_OVERFLOW:
                found.append(("", OVERFLOW))
                continue
            with self._lock:
                key = self._keys.pop(wd, None) if mask & _IN_IGNORED else self._keys.get(wd)
            if key is not None and mask & (_IN_OPEN | _IN_ACCESS):
                found.append((key, "open" if mask & _IN_OPEN else "access"))
        return found

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        for fd in (self._fd, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> CanaryWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
