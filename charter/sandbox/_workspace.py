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
following a link, clearing setuid and setgid bits.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

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
        self.limits = _Limits(entries=max_entries, depth=max_depth, size_bytes=size_bytes)
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

    def commit(self) -> None:
        """Apply the sandbox's changes to the directory (call it once no process of the
        sandbox remains: nothing changes the upper layer then). Refuses
        (:class:`WorkspaceRefusedError`), before anything of the directory is changed, an
        upper layer over the limits: more than ``max_entries`` entries, deeper than
        ``max_depth``, or regular files whose apparent sizes add up past the workspace
        cap (a sparse file counts at its full size: it is never delivered bigger than
        the cap). Symlinks and special files are not delivered.

        Then every file's data is first staged in a private directory of the
        destination (the writes that can fail: a full disk, an I/O error); a failure
        there removes the stage and leaves the directory as it was. Only then are the
        changes applied, as metadata: deletions, directories made, and each file
        linked in from the stage and renamed over its name."""
        try:
            upper = os.open(self.home / "upper", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                _survey(upper, self.limits)
                dest = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.dest)
                try:
                    stage_name, stage = _make_stage(dest)
                    try:
                        staged = _stage(upper, stage)
                        _apply(upper, dest, stage, staged)
                        _copy_attrs(os.fstat(upper), dest)
                    finally:
                        os.close(stage)
                        with contextlib.suppress(OSError):  # not to hide the first error
                            shutil.rmtree(stage_name, dir_fd=dest)
                finally:
                    os.close(dest)
            finally:
                os.close(upper)
        except OSError as e:
            raise SandboxUnavailableError(
                f"the sandbox's changes could not all be applied to its workspace: {e}"
            ) from e

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
_WHITEOUT_DEV = 0
_OPAQUE = "trusted.overlay.opaque"
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


def _copy_attrs(st: os.stat_result, fd: int) -> None:
    """Owner and mode of ``st`` onto ``fd``, never a setuid or setgid bit."""
    os.fchown(fd, st.st_uid, st.st_gid)
    os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~_SETID)


def _remove(dest: int, name: str) -> None:
    """Remove ``name`` from the directory ``dest``, a tree without following links."""
    try:
        st = os.stat(name, dir_fd=dest, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dest)
    else:
        os.unlink(name, dir_fd=dest)


_Staged = dict[int, str]
"""Upper-layer inode -> its data's name in the stage. A file with several names is
staged once and each name linked to it (a 30 MB file with a thousand links is 30 MB of
tmpfs, not 30 GB of disk); held as names, not descriptors, so thousands of linked files
hold no thousands of open files."""


def _make_stage(dest: int) -> tuple[str, int]:
    """A fresh directory of ``dest`` only root may enter, and its descriptor."""
    while True:
        name = f".charter-stage-{os.getpid()}-{secrets.token_hex(8)}"
        try:
            os.mkdir(name, 0o700, dir_fd=dest)
        except FileExistsError:  # the sandbox made one of that name: take another
            continue
        try:
            return name, os.open(name, _RDIR, dir_fd=dest)
        except BaseException:
            shutil.rmtree(name, dir_fd=dest, ignore_errors=True)
            raise


def _walk(upper: int) -> Generator[tuple[int, os.DirEntry[str], os.stat_result, int], None, None]:
    """Every entry below ``upper``: (its directory's fd, the entry, its lstat, how many
    directories are open above it). Iterative, one open directory per level; a
    directory is entered after it is yielded, so a caller that raises there never
    enters it. Use it in ``contextlib.closing`` so the fds close when the caller stops."""
    stack: list[tuple[int, Iterator[os.DirEntry[str]]]] = []
    try:
        stack.append((os.dup(upper), os.scandir(upper)))
        while stack:
            fd, listing = stack[-1]
            entry = next(listing, None)
            if entry is None:
                stack.pop()
                _close(fd, listing)
                continue
            st = entry.stat(follow_symlinks=False)
            yield fd, entry, st, len(stack)
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(entry.name, _RDIR, dir_fd=fd)
                try:
                    stack.append((sub, os.scandir(sub)))
                except BaseException:
                    os.close(sub)
                    raise
    finally:
        for fd, listing in stack:
            _close(fd, listing)


def _stage(upper: int, stage: int) -> _Staged:
    """Copy the data of every regular file of the upper layer (once per inode) into
    ``stage``, owners and modes set, setuid and setgid cleared (the depth
    :func:`_survey` bounded)."""
    staged: _Staged = {}
    with contextlib.closing(_walk(upper)) as walk:
        for fd, entry, st, _ in walk:
            if not stat.S_ISREG(st.st_mode) or st.st_ino in staged:
                continue
            name = str(len(staged))
            src = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            try:
                _copy_file(src, st, name, stage)
            finally:
                os.close(src)
            staged[st.st_ino] = name
    return staged


def _copy_file(src: int, st: os.stat_result, name: str, dir_fd: int) -> None:
    """A new file ``name`` in ``dir_fd`` (never one that exists, never through a
    link) with ``src``'s data, owner and mode (setuid and setgid cleared)."""
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                  dir_fd=dir_fd)  # fmt: skip
    try:
        _copy_data(src, out, st.st_size)
        _copy_attrs(st, out)
    finally:
        os.close(out)


class _Limits(NamedTuple):
    entries: int
    depth: int
    size_bytes: int


_RDIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _survey(upper: int, limits: _Limits) -> None:
    """Walk the upper layer (nothing changed anywhere) and refuse it if it is over
    ``limits``."""
    entries = size = 0
    sized: set[int] = set()  # inodes counted (a file with several links counts once)
    with contextlib.closing(_walk(upper)) as walk:
        for _, _, st, depth in walk:
            entries += 1
            if entries > limits.entries:
                raise _over(f"more than {limits.entries} entries")
            if stat.S_ISDIR(st.st_mode):
                if depth >= limits.depth:
                    raise _over(f"entries nested deeper than {limits.depth} levels")
            elif stat.S_ISREG(st.st_mode) and st.st_ino not in sized:
                sized.add(st.st_ino)
                size += st.st_size  # apparent: holes count, they would be delivered
                if size > limits.size_bytes:
                    raise _over(f"files of more than {limits.size_bytes} bytes in all")


def _over(what: str) -> WorkspaceRefusedError:
    return WorkspaceRefusedError(
        f"the sandbox's changes to its workspace hold {what}: none of them was applied "
        "(the directory is as it was before the run)"
    )


def _close(fd: int, listing: Iterator[os.DirEntry[str]]) -> None:
    close = getattr(listing, "close", None)
    if close is not None:
        close()
    os.close(fd)


class _Level(NamedTuple):
    """One directory being applied: the upper layer's and the destination's, the
    upper's listing, and the attributes the destination takes once it is done (None
    for the root, whose attributes the caller sets)."""

    upper: int
    dest: int
    listing: Iterator[os.DirEntry[str]]
    st: os.stat_result | None


def _apply(upper: int, dest: int, stage: int, staged: _Staged) -> None:
    """Make the directory ``dest`` what the overlay showed: every entry of the upper
    layer ``upper`` applied, through descriptors (no path is looked up twice, no
    symlink in ``dest`` is followed), iteratively (one level of descriptors per
    directory depth, which :func:`_survey` has bounded). Symlinks, fifos, sockets and
    devices made in the sandbox are not delivered (whatever was at their name on the
    host stays): a link in a host directory is followed by whoever reads it there."""
    stack = [_Level(upper, dest, os.scandir(upper), None)]
    try:
        while stack:
            level = stack[-1]
            entry = next(level.listing, None)
            if entry is None:
                stack.pop()
                close = getattr(level.listing, "close", None)
                if close is not None:
                    close()
                if level.st is not None:
                    try:
                        _copy_attrs(level.st, level.dest)
                    finally:
                        os.close(level.dest)
                        os.close(level.upper)
                continue
            name = entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == _WHITEOUT_DEV:
                _remove(level.dest, name)  # deleted in the sandbox
            elif stat.S_ISDIR(st.st_mode):
                stack.append(_enter_dir(level, name, st))
            elif stat.S_ISREG(st.st_mode):
                _apply_file(level.dest, name, stage, staged[st.st_ino])
    finally:
        for level in stack:
            close = getattr(level.listing, "close", None)
            if close is not None:
                close()
            if level.st is not None:
                os.close(level.dest)
                os.close(level.upper)


def _enter_dir(level: _Level, name: str, st: os.stat_result) -> _Level:
    """Open the directory ``name`` on both sides (made, or replaced, in ``dest`` as the
    sandbox left it) for :func:`_apply` to go into."""
    upper, dest = level.upper, level.dest
    sub_upper = os.open(name, _RDIR, dir_fd=upper)
    try:
        opaque = False
        with contextlib.suppress(OSError):
            opaque = os.getxattr(sub_upper, _OPAQUE) == b"y"
        existing = None
        with contextlib.suppress(FileNotFoundError):
            existing = os.stat(name, dir_fd=dest, follow_symlinks=False)
        if existing is not None and (opaque or not stat.S_ISDIR(existing.st_mode)):
            _remove(dest, name)  # replaced in the sandbox: nothing of the old one stays
            existing = None
        if existing is None:
            os.mkdir(name, 0o700, dir_fd=dest)
        sub_dest = os.open(name, _RDIR, dir_fd=dest)
        try:
            return _Level(sub_upper, sub_dest, os.scandir(sub_upper), st)
        except BaseException:
            os.close(sub_dest)
            raise
    except BaseException:
        os.close(sub_upper)
        raise


def _apply_file(dest: int, name: str, stage: int, staged: str) -> None:
    """Link the staged data into a fresh temporary entry of ``dest``, then rename it
    over ``name`` (a directory there is removed first)."""
    temp = f".charter-commit-{os.getpid()}-{threading.get_ident()}"
    _remove(dest, temp)
    try:
        os.link(staged, temp, src_dir_fd=stage, dst_dir_fd=dest, follow_symlinks=False)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        _copy_staged(stage, staged, dest, temp)  # another file system mounted there
    existing = None
    with contextlib.suppress(FileNotFoundError):
        existing = os.stat(name, dir_fd=dest, follow_symlinks=False)
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        _remove(dest, name)
    os.rename(temp, name, src_dir_fd=dest, dst_dir_fd=dest)


def _copy_staged(stage: int, staged: str, dest: int, temp: str) -> None:
    src = os.open(staged, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stage)
    try:
        _copy_file(src, os.fstat(src), temp, dest)
    finally:
        os.close(src)


def _copy_data(src: int, out: int, size: int) -> None:
    """Copy only the data of ``src`` (a tmpfs file) to ``out``, holes left as holes,
    then set the size. A sandbox can make a file of any apparent size at no cost to its
    tmpfs (``truncate -s 1T``): copying its holes as zeros would fill the host's disk,
    so what reaches the disk is the data the tmpfs held, which the cap bounds."""
    offset = 0
    while offset < size:
        try:
            data = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole is left
                break
            raise
        hole = os.lseek(src, data, os.SEEK_HOLE)
        os.lseek(out, data, os.SEEK_SET)
        while data < hole:
            sent = os.sendfile(out, src, data, hole - data)
            if sent == 0:
                break
            data += sent
        offset = hole
    os.ftruncate(out, size)
