"""A persistent workspace (``--workspace DIR``) on the host side: reached without ever
following a symlink, overlaid with a size-capped tmpfs that takes every write, and
updated from it once the sandbox is gone, with no setuid or setgid bit carried over.

A sandbox writing straight into a host directory could do three things that outlive it:
plant a symlink where the next sandbox's workspace path is looked up (a link to ``/``
once bound the host's root read-write into the next sandbox); leave a setuid file (bwrap
binds nosuid, so the bit does nothing inside, but the host's own mount honours it: any
local user could run it as the sandbox's host uid, reach the egress broker as that
sandbox, and signal or ptrace a later sandbox given the same uid); and fill the host's
disk. So :func:`open_workspace` opens each path component ``O_NOFOLLOW`` (a link is
refused), the opened directory is the overlay's lower layer (given to the kernel by its
descriptor, so no later swap of a path component is followed), every write lands in a
tmpfs of the workspace cap (ENOSPC past it; both mounts nosuid), and
:meth:`PersistentWorkspace.commit` applies the changes through descriptors, never
following a link, clearing setuid and setgid bits, in a child process placed in the
sandbox's CPU cgroups (``_copyback.py``), so the work the sandbox's files cost is charged
to the sandbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from charter.sandbox import _copyback
from charter.sandbox.errors import SandboxUnavailableError, WorkspaceRefusedError

__all__ = [
    "MAX_COMMIT_DEPTH",
    "MAX_COMMIT_ENTRIES",
    "PersistentWorkspace",
    "bind_source",
    "open_workspace",
    "unmount_stale",
]

MAX_COMMIT_ENTRIES = 20_000
"""The most entries (files, directories, deletions, skipped links) a sandbox's changes to
a persistent workspace may hold: applying each costs the launcher a few system calls
(274,581 files once took 155 s of its CPU)."""
MAX_COMMIT_DEPTH = 64
"""The deepest an entry of a sandbox's changes may be nested (the workspace root's own
entries are at depth 1, so directories go 63 levels down)."""

_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_workspace(path: Path) -> int:
    """An ``O_PATH`` descriptor of the directory ``path``, reached from ``/`` one
    component at a time without following any symlink. Refuses
    (:class:`WorkspaceRefusedError`) a relative path, a ``..`` component, a symlink
    anywhere on the path, or anything that is not a directory."""
    if not path.is_absolute():
        path = Path.cwd() / path  # the cwd itself was reached by the kernel, not a link
    if ".." in path.parts:
        raise WorkspaceRefusedError(f"workspace {path} has a '..' component: give its real path")
    root = os.open("/", _DIR)
    try:
        return walk_dirs(root, path.parts[1:], refused=lambda name, e: WorkspaceRefusedError(
            f"workspace {path}: {name!r} is a symlink or not a directory ({e.strerror}); "
            "a workspace is never reached through a symlink: give its real path"
        ))  # fmt: skip
    finally:
        os.close(root)


def walk_dirs(
    root_fd: int,
    parts: Sequence[str],
    *,
    make: bool = False,
    refused: Callable[[str, OSError], Exception] | None = None,
) -> int:
    """An ``O_PATH`` descriptor of the directory ``parts`` below ``root_fd``, reached one
    component at a time without following any symlink (with ``make``, made as needed,
    mode 0755). A component that cannot be opened raises ``refused(name, error)`` when
    given, else the ``OSError`` itself. ``root_fd`` stays the caller's."""
    fd = os.dup(root_fd)
    try:
        for name in parts:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except OSError as e:
                if refused is None:
                    raise
                raise refused(name, e) from e
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def bind_source(fd: int) -> str:
    """The path bwrap binds: the opened directory itself, whatever its path now names."""
    return f"/proc/self/fd/{fd}"


class PersistentWorkspace:
    """A ``--workspace`` as the sandbox sees it: an overlay whose lower layer is the
    directory (reached by :func:`open_workspace`) and whose upper layer, where every
    write of the sandbox goes, is a tmpfs of ``size_bytes`` in a root-only directory of
    the state directory. Writes past the cap fail inside with ENOSPC and never reach the
    host disk; nothing the sandbox writes is reachable by other host users while it
    runs. :meth:`commit`, once no process of the sandbox is left, applies the upper
    layer to the directory, bounded (entries, depth, bytes) and staged (files copied,
    deletions done, no symlink or special file delivered, nothing followed; setuid and
    setgid bits cleared); :meth:`close` unmounts and removes the rest."""

    def __init__(
        self,
        path: Path,
        home: Path,
        size_bytes: int,
        *,
        max_entries: int = MAX_COMMIT_ENTRIES,
        max_depth: int = MAX_COMMIT_DEPTH,
    ) -> None:
        if any(c in str(home) for c in ",:\\"):
            raise WorkspaceRefusedError(f"path {home} cannot hold an overlay layer")
        self.home = home
        self.limits = _copyback.Limits(entries=max_entries, depth=max_depth, size_bytes=size_bytes)
        self.dest = open_workspace(path)
        self._mounted: list[Path] = []
        try:
            # Traversable (bwrap resolves the bind source as the sandbox's uid), not
            # listable; both mounts are nosuid, so no setuid bit works through them.
            os.mkdir(home, 0o711)
            _mount(b"tmpfs", home, b"tmpfs", _MS_NOSUID | _MS_NODEV,
                   f"size={size_bytes},mode=0711".encode())  # fmt: skip
            self._mounted.append(home)
            for name in ("upper", "work", "merged"):
                os.mkdir(home / name, 0o700)
            # The merged root takes the upper root's owner and mode: the directory's own.
            st = os.stat(self.dest)
            os.chown(home / "upper", st.st_uid, st.st_gid)
            os.chmod(home / "upper", stat.S_IMODE(st.st_mode))
            layers = f"lowerdir={bind_source(self.dest)},upperdir={home}/upper,workdir={home}/work"
            _mount(b"overlay", home / "merged", b"overlay", _MS_NOSUID | _MS_NODEV,
                   layers.encode())  # fmt: skip
            self._mounted.append(home / "merged")
        except OSError as e:
            self.close()
            raise WorkspaceRefusedError(f"workspace {path} cannot be overlaid: {e}") from e
        except BaseException:
            self.close()
            raise

    @property
    def merged(self) -> Path:
        """What bwrap binds at /workspace: a path only the launcher (root) makes."""
        return self.home / "merged"

    def commit(self, join: Sequence[str] = ()) -> None:
        """Apply the sandbox's changes to the directory (call it once no process of the
        sandbox remains: nothing changes the upper layer then), in a child process that
        first joins the cgroups whose membership files ``join`` names (the sandbox's
        CPU cgroups, :func:`~charter.sandbox._cgroup.cpu_join_files`): the copy-back's
        CPU is the sandbox's, counted in its usage and throttled by its quota, not the
        launcher's. What the child does is ``_copyback.deliver``: refused
        (:class:`WorkspaceRefusedError`), before anything of the directory is changed,
        when the upper layer is over the limits (entries, depth, apparent bytes);
        symlinks and special files not delivered; data staged before any change is
        made. Any other failure raises :class:`SandboxUnavailableError`."""
        fds: list[int] = []
        try:
            fds.append(os.open(self.home / "upper", _RDIR))
            fds.append(os.open(".", _RDIR, dir_fd=self.dest))
            fds += (os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in join)
            limits = self.limits
            argv = [sys.executable, "-I", "-S", _copyback.__file__,
                    str(limits.entries), str(limits.depth), str(limits.size_bytes),
                    *map(str, fds)]  # fmt: skip
            with subprocess.Popen(
                argv, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=fds,
            ) as child:  # fmt: skip
                said, cried = child.communicate()
            if child.returncode < 0:  # killed while staging: its stage is named by its pid
                _remove_stages(fds[1], child.pid)
        except OSError as e:
            raise SandboxUnavailableError(
                f"the sandbox's changes could not be applied to its workspace: {e}"
            ) from e
        finally:
            for fd in fds:
                os.close(fd)
        if child.returncode == _copyback.EXIT_REFUSED:
            raise WorkspaceRefusedError(said.decode("utf-8", "replace"))
        if child.returncode != 0:
            detail = (said or cried[-2000:]).decode("utf-8", "replace").strip()
            raise SandboxUnavailableError(
                f"the sandbox's changes could not all be applied to its workspace: {detail} "
                f"(copy-back exit {child.returncode})"
            )

    def close(self) -> None:
        """Unmount the overlay and its tmpfs (the upper layer's bytes go with it)."""
        while self._mounted:
            _umount(self._mounted.pop())
        with contextlib.suppress(OSError):
            shutil.rmtree(self.home)
        if self.dest >= 0:
            os.close(self.dest)
            self.dest = -1


_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 0x2, 0x4, 0x2
_RDIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]  # fmt: skip
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _mount(source: bytes, target: Path, fstype: bytes, flags: int, data: bytes) -> None:
    if _libc.mount(source, bytes(target), fstype, flags, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype.decode()} at {target}: {os.strerror(err)}")


def _umount(target: Path) -> None:
    """Detach ``target`` (lazily: an open file keeps the mount, not the path)."""
    _libc.umount2(bytes(target), _MNT_DETACH)


def unmount_stale(home: Path) -> None:
    """Unmount and remove a workspace's overlay and tmpfs left by a launcher that died
    (its changes are discarded: only a run that ended commits)."""
    _umount(home / "merged")
    _umount(home)
    with contextlib.suppress(OSError):
        shutil.rmtree(home)


def _remove_stages(dest: int, pid: int) -> None:
    """Remove the stage a copy-back child ``pid`` that was killed left in ``dest``."""
    prefix = f"{_copyback.STAGE_PREFIX}{pid}-"
    with contextlib.suppress(OSError):
        for name in os.listdir(dest):
            if name.startswith(prefix):
                with contextlib.suppress(OSError):
                    shutil.rmtree(name, dir_fd=dest)
