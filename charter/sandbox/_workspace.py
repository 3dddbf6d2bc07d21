"""A persistent workspace (``--workspace DIR``) on the host side: opened without ever
following a symlink, bound into the sandbox through that open descriptor, and left with
no setuid or setgid file once the sandbox is gone.

A sandbox writes into its workspace as its host uid. Two things it could leave there
would outlive it and work against the host: a symlink where the next sandbox's
workspace path is looked up (a link to ``/`` once bound the host's root read-write into
the next sandbox), and a setuid file (bwrap binds the directory nosuid, so the bit does
nothing inside, but the host's own mount honours it: any local user could run it as the
sandbox's host uid, reach the egress broker as that sandbox, and signal or ptrace a later
sandbox given the same uid). The first is closed by :func:`open_workspace` (each path
component opened ``O_NOFOLLOW``; bwrap binds the opened directory itself, through
``/proc/self/fd``, so no later swap of a path component is followed either), the second
by :func:`strip_setid`, run after the sandbox's last process is gone.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from charter.sandbox.errors import WorkspaceRefusedError

__all__ = ["bind_source", "open_workspace", "strip_setid"]

_SETID = stat.S_ISUID | stat.S_ISGID
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
    fd = os.open("/", _DIR)
    try:
        for name in path.parts[1:]:
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except OSError as e:
                raise WorkspaceRefusedError(
                    f"workspace {path}: {name!r} is a symlink or not a directory ({e.strerror}); "
                    "a workspace is never reached through a symlink: give its real path"
                ) from e
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def bind_source(fd: int) -> str:
    """The path bwrap binds: the opened directory itself, whatever its path now names."""
    return f"/proc/self/fd/{fd}"


def strip_setid(fd: int) -> int:
    """Clear the setuid and setgid bits of everything under the directory ``fd`` (and of
    the directory itself); returns how many entries had one. Symlinks are never
    followed. Call it once no process of the sandbox remains: nothing races it then but
    another sandbox sharing the workspace, whose entries it reaches only through the
    descriptors of directories it opened itself."""
    stripped = 0
    top = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    try:
        for _, _, files, dir_fd in os.fwalk(dir_fd=top, follow_symlinks=False):
            for name in files:
                stripped += _clear_entry(dir_fd, name)
            stripped += _clear(dir_fd)
    finally:
        os.close(top)
    return stripped


def _clear(fd: int) -> int:
    mode = os.fstat(fd).st_mode
    if mode & _SETID:
        os.chmod(fd, stat.S_IMODE(mode) & ~_SETID)
        return 1
    return 0


def _clear_entry(dir_fd: int, name: str) -> int:
    """Clear the bits of ``name`` in ``dir_fd`` (a file, fifo, socket; never a symlink's
    target), through an ``O_PATH`` descriptor of the entry itself."""
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode) or not st.st_mode & _SETID:
            return 0
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                return 0
            # chmod through the descriptor's /proc link: it names this inode, not a path.
            os.chmod(bind_source(fd), stat.S_IMODE(mode) & ~_SETID)
            return 1
        finally:
            os.close(fd)
    return 0
