"""The operator's terminal is out of a sandbox's reach: a launcher whose stdio and
controlling terminal is a real pty runs a sandbox that tries to change the terminal's
settings, resize it (SIGWINCH to the operator's foreground group) and push keystrokes."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]

ATTACK = """
import fcntl, os, struct, termios
res = []
for fd in (0, 1, 2):
    tty = os.isatty(fd)
    try:
        a = termios.tcgetattr(fd)
        a[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, a)
        attr = True
    except (OSError, termios.error):
        attr = False
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 11, 22, 0, 0))
        winsz = True
    except OSError:
        winsz = False
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"X")
        sti = True
    except OSError:
        sti = False
    res.append(f"{fd}:{int(tty)}{int(attr)}{int(winsz)}{int(sti)}")
print("RESULT", " ".join(res), flush=True)
"""

LAUNCHER = """
import signal, sys
from pathlib import Path
from charter.core.budget import Budget
from charter.sandbox import Launcher, MemorySink
winched = []
signal.signal(signal.SIGWINCH, lambda *_: winched.append(1))
o = Launcher(MemorySink(), state_dir=Path(sys.argv[1])).run(
    Budget.parse("tokens=0,wall=30s,cpu=30s,mem=128MiB,egress=0MB"), sys.argv[2:])
print("WINCHED", len(winched), "EXIT", o.exit_code, flush=True)
"""

# The positive control's host side: the same program run with the terminal as is.
UNSANDBOXED = """
import signal, subprocess, sys
winched = []
signal.signal(signal.SIGWINCH, lambda *_: winched.append(1))
subprocess.run(sys.argv[1:], check=False)
print("WINCHED", len(winched), "EXIT 0", flush=True)
"""

PY = "/usr/bin/python3"


def _take_terminal() -> None:
    """In the child: a new session whose controlling terminal is the pty (stdin)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _winsize(fd: int) -> tuple[int, int]:
    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return rows, cols


def _run_on_pty(argv: list[str]) -> tuple[int, str, int, bool, tuple[int, int], int]:
    """Run ``argv`` with a fresh pty as its stdio and controlling terminal: its exit code,
    what it wrote, then the terminal's state afterwards (bytes queued as input, ECHO
    still on, window size) and the SIGWINCHes its foreground group got."""
    master, slave = pty.openpty()
    try:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
        proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            preexec_fn=_take_terminal, cwd=REPO,  # noqa: PLW1509 (a test's own child)
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        output = b""
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                output += os.read(master, 65536)
        assert proc.poll() is not None, "the run did not end"
        while select.select([master], [], [], 0.2)[0]:
            try:
                output += os.read(master, 65536)
            except OSError:
                break
        queued = struct.unpack("i", fcntl.ioctl(slave, termios.FIONREAD, b"\0" * 4))[0]
        echo = bool(termios.tcgetattr(slave)[3] & termios.ECHO)
        text = output.decode(errors="replace")
        winched = int(text.split("WINCHED", 1)[1].split()[0]) if "WINCHED" in text else -1
        return proc.returncode, text, queued, echo, _winsize(master), winched
    finally:
        os.close(master)
        os.close(slave)


def _result(text: str) -> dict[str, str]:
    line = next(line for line in text.splitlines() if line.startswith("RESULT"))
    return dict(item.split(":") for item in line.split()[1:])


def test_a_sandbox_cannot_touch_the_operators_terminal(state_dir: Path) -> None:
    code, text, queued, echo, size, winched = _run_on_pty(
        [sys.executable, "-c", LAUNCHER, str(state_dir), PY, "-I", "-c", ATTACK]
    )
    assert code == 0, text
    # Inside: no descriptor is a terminal, so each attempt failed ...
    assert _result(text) == {"0": "0000", "1": "0000", "2": "0000"}, text
    # ... and the terminal is as it was: echo on, size kept, no keystroke, no SIGWINCH.
    assert echo
    assert size == (40, 100)
    assert queued == 0
    assert winched == 0
    assert "EXIT 0" in text  # the sandbox's output reached the terminal (relayed)


def test_the_same_program_on_the_terminal_changes_it() -> None:
    """Positive control: given the terminal itself, the program changes its settings
    and size, and the kernel signals the operator's foreground group."""
    code, text, _, echo, size, winched = _run_on_pty(
        [sys.executable, "-c", UNSANDBOXED, PY, "-I", "-c", ATTACK]
    )
    assert code == 0, text
    result = _result(text)
    assert result["0"][:3] == "111"  # a terminal; settings and size changed
    assert not echo
    assert size == (11, 22)
    assert winched >= 1
