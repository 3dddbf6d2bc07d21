"""A live sandbox's workspace as evidence: one digest over every file in it.

Read from the host through ``/proc/<pid>/root/workspace`` of a process that is in the
sandbox's own mount namespace (:func:`~charter.sandbox._signals.sandbox_pid`), so a
warm-pool slot's overlay (which exists only in that namespace) is read as the sandbox
sees it. Freeze the sandbox first: a frozen worker cannot change what is read. Every
directory and file is opened ``O_NOFOLLOW`` relative to its parent's descriptor, so a
symlink the worker planted is recorded as a link (its target's text), never followed
out of the workspace.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass

from charter.sandbox._signals import sandbox_pid
from charter.sandbox.errors import SandboxUnavailableError
from charter.sandbox.spec import SandboxSpec

__all__ = ["MAX_DIGESTED_BYTES", "WorkspaceDigest", "digest_workspace"]

MAX_DIGESTED_BYTES = 256 * 1024 * 1024
"""The most file bytes read into one digest; past it each file is digested by its size
alone and ``truncated`` says so (a workspace is capped by its tmpfs size anyway)."""

_CHUNK = 1 << 16


@dataclass(frozen=True)
class WorkspaceDigest:
    """sha256 hex over every entry (path, kind, mode, size, content) in path order; how
    many files and bytes; whether the byte bound cut the content short."""

    digest: str
    files: int
    bytes: int
    truncated: bool


def digest_workspace(spec: SandboxSpec) -> WorkspaceDigest:
    """The digest of ``spec``'s sandbox's workspace now. Raises
    :class:`SandboxUnavailableError` when the sandbox has no process left to read it
    through (fail closed: no digest is made up)."""
    pid = sandbox_pid(spec)
    if pid is None:
        raise SandboxUnavailableError(f"sandbox {spec.sandbox_id} has no process left")
    try:
        root = os.open(f"/proc/{pid}/root/workspace", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise SandboxUnavailableError(f"sandbox {spec.sandbox_id}: no workspace: {e}") from e
    h = hashlib.sha256()
    tally = [0, 0, 0]  # files, bytes, truncated
    try:
        _walk(root, "", h, tally)
    finally:
        os.close(root)
    return WorkspaceDigest(h.hexdigest(), tally[0], tally[1], bool(tally[2]))


def _walk(dir_fd: int, prefix: str, h: hashlib._Hash, tally: list[int]) -> None:
    for name in sorted(os.listdir(dir_fd)):
        path = f"{prefix}{name}"
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        head = f"{len(path)}:{path}:{stat.S_IFMT(st.st_mode)}:{st.st_mode & 0o7777}:{st.st_size}"
        h.update(head.encode("utf-8", "surrogateescape"))
        if stat.S_ISDIR(st.st_mode):
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                sub = os.open(name, flags, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                _walk(sub, f"{path}/", h, tally)
            finally:
                os.close(sub)
        elif stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(name, dir_fd=dir_fd).encode("utf-8", "surrogateescape"))
        elif stat.S_ISREG(st.st_mode):
            tally[0] += 1
            tally[1] += st.st_size
            if tally[1] > MAX_DIGESTED_BYTES:
                tally[2] = 1
                continue
            _file(dir_fd, name, h)


def _file(dir_fd: int, name: str, h: hashlib._Hash) -> None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        h.update(b"<unreadable>")
        return
    try:
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
    finally:
        os.close(fd)
