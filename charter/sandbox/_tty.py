"""No terminal in a sandbox: a stdio stream that is a terminal is never handed in.

bwrap's ``--new-session`` takes the sandbox out of the operator's session, so the
terminal is not its controlling one and TIOCSTI (pushing keystrokes) is refused. But a
terminal *descriptor* inherited as stdin, stdout or stderr still works on the terminal
itself: tcsetattr changes the operator's settings (echo off, raw mode), and TIOCSWINSZ
makes the kernel send SIGWINCH to the operator's foreground process group, a signal to
host processes. So stdin that is a terminal becomes /dev/null, and stdout or stderr
that is one becomes a pipe whose bytes a launcher thread copies to the terminal: the
sandbox gets the output path and nothing else of the terminal.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from typing import IO, Any

__all__ = ["TerminalGuard"]

Stdio = int | IO[Any] | None
_RELAY_CHUNK = 65536


def _fd_of(stream: Stdio, default: int) -> int | None:
    """The descriptor ``stream`` stands for (None: the launcher's own ``default``), or
    None for subprocess's markers (PIPE, DEVNULL) and objects without one."""
    if stream is None:
        return default
    if isinstance(stream, int):
        return stream if stream >= 0 else None
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _is_terminal(stream: Stdio, default: int) -> bool:
    fd = _fd_of(stream, default)
    return fd is not None and os.isatty(fd)


class TerminalGuard:
    """The sandbox's stdio with every terminal replaced; call :meth:`spawned` right after
    the spawn (the launcher's copies of the pipes' write ends are closed) and
    :meth:`finish` once the sandbox's processes are gone (the relays drain and end)."""

    def __init__(self, stdin: Stdio, stdout: Stdio, stderr: Stdio) -> None:
        self._write_ends: list[int] = []
        self._relays: list[threading.Thread] = []
        self.stdin: Stdio = subprocess.DEVNULL if _is_terminal(stdin, 0) else stdin
        self.stdout = self._relayed(stdout, 1)
        self.stderr = self._relayed(stderr, 2)

    def _relayed(self, stream: Stdio, default: int) -> Stdio:
        if not _is_terminal(stream, default):
            return stream
        terminal = _fd_of(stream, default)
        if terminal is None:  # unreachable: a terminal has a descriptor
            return subprocess.DEVNULL
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        self._write_ends.append(write_end)
        relay = threading.Thread(
            target=_relay, args=(read_end, terminal), daemon=True, name="sandbox-tty-relay"
        )
        relay.start()
        self._relays.append(relay)
        return write_end

    def spawned(self) -> None:
        """The child has its copies: the relays see EOF once the sandbox's are closed."""
        for fd in self._write_ends:
            os.close(fd)
        self._write_ends = []

    def finish(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for the relays to copy what is left and end."""
        self.spawned()
        for relay in self._relays:
            relay.join(timeout)


def _relay(read_end: int, terminal: int) -> None:
    """Copy the pipe to the terminal until EOF. A terminal that fails (closed, hung up)
    stops the copying, not the draining: the sandbox never blocks on a full pipe."""
    writing = True
    try:
        while chunk := os.read(read_end, _RELAY_CHUNK):
            view = memoryview(chunk)
            while writing and view:
                try:
                    view = view[os.write(terminal, view) :]
                except OSError:
                    writing = False
    finally:
        with contextlib.suppress(OSError):
            os.close(read_end)
