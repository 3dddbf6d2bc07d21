"""One sandboxed process: cgroup, child set-up (join cgroup, overlay, rlimits, uid drop),
bwrap, the wall clock, kill and clean-up. Shared by the cold launcher and the warm pool."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal

import charter.sandbox._janitor as janitor
from charter.sandbox._cgroup import Cgroup, CgroupUsage, home_fds
from charter.sandbox._tty import TerminalGuard
from charter.sandbox.errors import SandboxUnavailableError
from charter.sandbox.render import BwrapFds, render_bwrap, render_seccomp
from charter.sandbox.spec import CgroupMode, SandboxSpec

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_WALL_CLOCK",
    "HeldInterrupt",
    "Overlay",
    "SandboxProcess",
    "exit_code_of",
]

EXIT_WALL_CLOCK = 124
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
_LIMITED = (resource.RLIMIT_NPROC, resource.RLIMIT_NOFILE, resource.RLIMIT_CORE)
_spawn_lock = threading.Lock()  # the cold spawn lowers process-wide soft rlimits for a fork
_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
_libc = ctypes.CDLL(None, use_errno=True)
_cstr = ctypes.c_char_p
_libc.mount.argtypes = [_cstr, _cstr, _cstr, ctypes.c_ulong, _cstr]
_libc.unshare.argtypes = [ctypes.c_int]

# bwrap itself starts with an empty environment. Its --clearenv clears only the
# command's: bwrap's own process, and so the pid 1 it forks inside the sandbox (same
# uid, dumpable), would otherwise keep the launcher's whole environment, readable from
# inside at /proc/1/environ. The command's environment is the spec's (--setenv), and
# bwrap needs nothing from its own (the binary's path is absolute).
_BWRAP_ENV: dict[str, str] = {}

Stdio = int | IO[Any] | None
How = Literal["exited", "signalled", "wall_clock", "interrupted"]


def exit_code_of(returncode: int) -> int:
    """Popen's code as a shell reports it: 128+N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Overlay:
    """A slot's workspace: an overlay whose upper layer lives on a size-capped tmpfs in a
    private mount namespace, so it vanishes with the slot's last process."""

    def __init__(self, template: Path, slot_dir: Path, size_bytes: int) -> None:
        for path in (template, slot_dir):
            if any(c in str(path) for c in ",:\\"):
                raise SandboxUnavailableError(f"path {path} cannot be an overlay layer")
        self.template = template
        self.slot_dir = slot_dir
        self.size_bytes = size_bytes

    @property
    def merged(self) -> Path:
        return self.slot_dir / "merged"

    def mount_in_child(self, uid: int, gid: int) -> None:
        """Runs in the forked child, as root, before the uid drop."""

        def check(rc: int, what: str) -> None:
            if rc != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"{what}: {os.strerror(err)}")

        check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        # Private propagation: nothing mounted here is seen by the host, and back.
        check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        slot = bytes(self.slot_dir)
        opts = f"size={self.size_bytes},mode=0755".encode()
        check(_libc.mount(b"tmpfs", slot, b"tmpfs", _MS_NOSUID | _MS_NODEV, opts), "tmpfs")
        for name in ("upper", "work", "merged"):
            os.mkdir(self.slot_dir / name, 0o755)
        os.chown(self.slot_dir / "upper", uid, gid)
        layers = (
            f"lowerdir={self.template},upperdir={self.slot_dir}/upper,workdir={self.slot_dir}/work"
        ).encode()
        check(
            _libc.mount(b"overlay", bytes(self.merged), b"overlay", _MS_NOSUID | _MS_NODEV, layers),
            "overlay",
        )


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class HeldInterrupt:
    """Ctrl-C held back from just before a sandbox's start is journaled until its wait
    begins (:meth:`SandboxProcess.wait_or_interrupt` lets it go). An interrupt in that
    window used to leave the start with no end on record; held, it reaches the wait,
    which kills the sandbox and reports it interrupted for the caller to journal.

    Only the main thread gets KeyboardInterrupt, and only it may swap the SIGINT
    handler; elsewhere, or under a handler of the caller's own, this holds nothing."""

    def __init__(self) -> None:
        self.pending = False
        self._previous: Any = None
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous = signal.signal(signal.SIGINT, self._hold)

    def _hold(self, signum: int, frame: object) -> None:
        del signum, frame
        self.pending = True

    def release(self, *, raise_pending: bool = True) -> None:
        """Put the handler back; raise the held interrupt, if one came (and asked)."""
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
            if self.pending and raise_pending:
                raise KeyboardInterrupt


class SandboxProcess:
    """bwrap started with the spec's caps; ``wait`` enforces the wall clock."""

    def __init__(
        self,
        spec: SandboxSpec,
        command: list[str],
        *,
        bwrap: str,
        overlay: Overlay | None = None,
        extra_fds: tuple[int, ...] = (),
        stdin: Stdio = None,
        stdout: Stdio = None,
        stderr: Stdio = None,
    ) -> None:
        self.spec = spec
        # No terminal descriptor reaches the sandbox (see _tty): stdin that is one is
        # /dev/null, stdout/stderr that are one are relayed through pipes.
        self._terminal = TerminalGuard(stdin, stdout, stderr)
        stdin, stdout, stderr = self._terminal.stdin, self._terminal.stdout, self._terminal.stderr
        try:
            self.cgroup = Cgroup(spec)
        except BaseException:
            self._terminal.finish()
            raise
        fds: list[int] = []
        try:
            seccomp = _memfd("seccomp", render_seccomp(spec))
            fds.append(seccomp)
            files = tuple(_memfd("file", content.encode()) for _, content in spec.files)
            fds += files
            argv = render_bwrap(spec, command, BwrapFds(seccomp, files), bwrap=bwrap)
            if overlay is None and spec.cgroup_mode is CgroupMode.V1:
                self.proc = self._spawn_from_thread(argv, (*fds, *extra_fds), stdin, stdout, stderr)
            else:
                self.proc = subprocess.Popen(
                    argv,
                    env=_BWRAP_ENV,
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                    pass_fds=(*fds, *extra_fds),
                    close_fds=True,
                    preexec_fn=self._child_setup(overlay),  # noqa: PLW1509 (see _child_setup)
                )
        except (OSError, subprocess.SubprocessError) as e:
            self.cgroup.remove()
            raise SandboxUnavailableError(f"cannot start the sandbox: {e}") from e
        finally:
            for fd in fds:
                os.close(fd)
            self.cgroup.close_join_fds()
            self._terminal.spawned()
        self.started_at = time.monotonic()
        self._pidfd = os.pidfd_open(self.proc.pid)

    def _limits(self) -> tuple[tuple[int, int], ...]:
        """(resource, value): the sandbox's caps, in force as soft limits, which its
        seccomp filter stops it from changing (no setrlimit, no prlimit64 with a new
        limit), so a hard limit above them cannot be reached. Never above this
        process's own hard limit, which only CAP_SYS_RESOURCE could exceed."""
        wanted = (
            self.spec.nproc,  # a backstop to pids.max (the host uid is unique)
            self.spec.nofile,
            0,  # RLIMIT_CORE: no core dumps of sandbox memory onto the host
        )
        capped = []
        for which, value in zip(_LIMITED, wanted, strict=True):
            hard = resource.getrlimit(which)[1]
            capped.append((which, value if hard == resource.RLIM_INFINITY else min(value, hard)))
        return tuple(capped)

    def _spawn_from_thread(
        self, argv: list[str], fds: tuple[int, ...], stdin: Stdio, stdout: Stdio, stderr: Stdio
    ) -> subprocess.Popen[bytes]:
        """The cold path without Python in the child: this thread joins the sandbox's
        cgroups (v1 ``tasks`` moves one thread, no global lock), forks with the soft
        rlimits in force, and moves back home; the child inherits both at fork, before
        it runs an instruction of its own. rlimits are process-wide, so the soft limits
        are lowered for the instant of the spawn and restored at once (under a lock, so
        cold spawns do not interleave). Only soft limits: root here lacks
        CAP_SYS_RESOURCE, so a lowered hard limit could not be raised back; the
        sandbox's seccomp filter makes the soft limits final instead. Root is exempt
        from RLIMIT_NPROC, so this process's own forks are unaffected."""
        spec = self.spec
        with _spawn_lock:
            saved = [(which, resource.getrlimit(which)) for which in _LIMITED]
            home = home_fds()
            try:
                for (which, soft), (_, (_, hard)) in zip(self._limits(), saved, strict=True):
                    resource.setrlimit(which, (soft, hard))
                for fd in self.cgroup.join_fds:
                    os.write(fd, b"0")
                return subprocess.Popen(
                    argv, env=_BWRAP_ENV, stdin=stdin, stdout=stdout, stderr=stderr,
                    pass_fds=fds, close_fds=True,
                    user=spec.host_uid, group=spec.host_gid, extra_groups=[],
                )  # fmt: skip
            finally:
                for fd in home:
                    os.write(fd, b"0")
                for which, limits in saved:
                    resource.setrlimit(which, limits)

    def _child_setup(self, overlay: Overlay | None) -> Callable[[], None]:
        spec, join, limits = self.spec, tuple(self.cgroup.join_fds), self._limits()

        def setup() -> None:
            for fd in join:
                os.write(fd, b"0")  # join every cap before anything else runs
            if overlay is not None:
                overlay.mount_in_child(spec.host_uid, spec.host_gid)
            for which, value in limits:
                resource.setrlimit(which, (value, value))
            # The unique unprivileged host uid: bwrap launched by root would map the
            # sandbox to host root, and root-only host files would be readable.
            os.setgroups([])
            os.setresgid(spec.host_gid, spec.host_gid, spec.host_gid)
            os.setresuid(spec.host_uid, spec.host_uid, spec.host_uid)

        return setup

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, deadline: float | None = None) -> tuple[int, How]:
        """Wait for the end; at the deadline (monotonic) kill everything: exit 124."""
        if deadline is None:
            deadline = self.started_at + self.spec.wall_ms / 1000
        # A pidfd wakes exactly at the exit (Popen.wait(timeout) polls with sleeps).
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
        if not poller.poll(remaining_ms) and self.proc.poll() is None:
            self.kill()
            return EXIT_WALL_CLOCK, "wall_clock"
        rc = self.proc.wait()
        return exit_code_of(rc), ("signalled" if rc < 0 or rc > 128 else "exited")

    def wait_or_interrupt(
        self, deadline: float | None = None, held: HeldInterrupt | None = None
    ) -> tuple[int, How]:
        """:meth:`wait`; on Ctrl-C (SIGINT at the launcher) the sandbox is killed and its
        end reported as ``interrupted`` with exit code 130, for the caller to journal
        before it passes the interrupt on. ``held``: the interrupt held back since the
        start was journaled, let go here, inside the wait (one that came meanwhile
        interrupts it at once)."""
        try:
            if held is not None:
                held.release()
            return self.wait(deadline)
        except KeyboardInterrupt:
            self.kill()
            return EXIT_INTERRUPTED, "interrupted"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.cgroup.kill_all()
        self.proc.wait()

    def usage(self) -> CgroupUsage:
        return self.cgroup.usage()

    def end(self) -> None:
        """Kill whatever is left and wait until no process of the sandbox remains (its
        cgroup stays, for a copy-back to join and its usage to be read)."""
        if self.proc.poll() is None:
            self.kill()
        if not self.cgroup.wait_empty():
            self.cgroup.kill_all()
        self._terminal.finish()  # no process holds the relays' pipes now

    def destroy(self, *, defer_removal: bool = False) -> None:
        """:meth:`end`, then remove the (empty) cgroup, on the janitor thread if
        ``defer_removal``."""
        self.end()
        if defer_removal:
            janitor.defer(self.cgroup.remove)
        else:
            self.cgroup.remove()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
