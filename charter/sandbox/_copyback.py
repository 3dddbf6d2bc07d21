"""Applying a sandbox's changes to its persistent workspace, run as a short-lived child
process of the launcher placed in the sandbox's own CPU cgroup: the copy-back's CPU is
the sandbox's (counted in its usage, throttled by its quota), not the launcher's.

Delivering 19,800 files once cost the launcher 1.12 s of its own CPU, 3.6x what the
worker spent making them; a sandbox could make the control plane work for it uncharged.
So :meth:`~charter.sandbox._workspace.PersistentWorkspace.commit` runs this file as a
script (``python -I -S``: the standard library only, nothing of the environment or the
site), handing it the upper layer and the destination as descriptors (opened by the
launcher, never by a path here) and the sandbox's cgroup files to join, which it writes
before anything else. It runs as root, as the launcher would, reading what the sandbox
left: every directory is opened ``O_NOFOLLOW`` below a descriptor, every file ``O_NOFOLLOW``,
nothing is looked up by a path twice, and no symlink or special file is delivered.

Exit 0: applied. Exit :data:`EXIT_REFUSED` with the reason on stdout: over the limits,
nothing applied. Exit :data:`EXIT_FAILED` with the error on stdout: an ``OSError``
(staging failures leave the directory as it was; see ``deliver``).

This module imports nothing of ``charter`` (it runs outside the package), which
``tests/sandbox/test_workspace_commit.py`` checks.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # The sandbox's cgroups are joined before anything else is imported: only the bare
    # interpreter's start precedes it (the imports below cost several times that).
    for _fd in sys.argv[6:]:
        os.write(int(_fd), b"0")

import contextlib
import errno
import shutil
import stat
import threading
from collections.abc import Generator, Iterator
from typing import NamedTuple

__all__ = ["EXIT_FAILED", "EXIT_REFUSED", "STAGE_PREFIX", "Limits", "Refused", "deliver"]

EXIT_REFUSED = 3
EXIT_FAILED = 2

_SETID = stat.S_ISUID | stat.S_ISGID
_RDIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WHITEOUT_DEV = 0
_OPAQUE = "trusted.overlay.opaque"
STAGE_PREFIX = ".charter-stage-"
"""A stage is ``STAGE_PREFIX`` + the pid of the process staging + ``-`` + random hex."""


class Limits(NamedTuple):
    """The most a sandbox's changes may hold: entries, nesting depth, apparent bytes."""

    entries: int
    depth: int
    size_bytes: int


class Refused(Exception):  # noqa: N818 (a refusal, told to the launcher by exit code)
    """The changes are over the limits: nothing of them was applied."""


def deliver(upper: int, dest: int, limits: Limits) -> None:
    """Apply the upper layer ``upper`` to the directory ``dest`` (both descriptors).

    Refuses (:class:`Refused`), before anything of the directory is changed, an upper
    layer over ``limits``: more entries, deeper nesting, or regular files whose
    apparent sizes add up past the byte cap (a sparse file counts at its full size).
    Then every file's data is staged in a private directory of the destination (the
    writes that can fail: a full disk, an I/O error); a failure there removes the
    stage and leaves the directory as it was. Only then are the changes applied, as
    metadata: deletions, directories made, each file linked in from the stage and
    renamed over its name; the root takes the upper root's owner and mode."""
    _survey(upper, limits)
    stage_name, stage = _make_stage(dest)
    try:
        staged = _stage(upper, stage)
        _apply(upper, dest, stage, staged)
        _copy_attrs(os.fstat(upper), dest)
    finally:
        os.close(stage)
        with contextlib.suppress(OSError):  # not to hide the first error
            shutil.rmtree(stage_name, dir_fd=dest)


def main(argv: list[str]) -> int:
    """``ENTRIES DEPTH BYTES UPPER_FD DEST_FD [CGROUP_FD...]`` (the cgroup files, opened
    for writing by the launcher, are joined at the top of this file, run as a script)."""
    entries, depth, size_bytes, upper, dest = (int(x) for x in argv[1:6])
    try:
        deliver(upper, dest, Limits(entries, depth, size_bytes))
    except Refused as e:
        return _said(EXIT_REFUSED, e)
    except OSError as e:
        return _said(EXIT_FAILED, e)
    return 0


def _said(code: int, error: Exception) -> int:
    """Tell the launcher ``error`` on stdout (names the sandbox made may be any bytes)."""
    os.write(1, str(error).encode("utf-8", "backslashreplace"))
    return code


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
        name = f"{STAGE_PREFIX}{os.getpid()}-{os.urandom(8).hex()}"
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


def _survey(upper: int, limits: Limits) -> None:
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


def _over(what: str) -> Refused:
    return Refused(
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
