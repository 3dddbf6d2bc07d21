"""One naming rule for the sockets of the sandbox state directory (``KIND-PID.sock``,
``KIND-OWNER-PID.sock``): what a SIGKILLed launcher *or cell* leaves (its broker, its
door) is swept by ``charter sandbox reap``; a live server's socket never is, whatever
its name looks like."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.sandbox import reap_host
from charter.sandbox._janitor import SOCKET_NAME, socket_name, sweep_sockets

REPO = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    """The pid of a process that has exited and been waited for."""
    child = subprocess.Popen(["/bin/true"])
    child.wait()
    return child.pid


def _left(path: Path) -> Path:
    """A socket file nobody listens on: what a SIGKILLed server leaves."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
    return path


@contextlib.contextmanager
def _serving(path: Path) -> Iterator[socket.socket]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        s.listen(1)
        yield s


def test_a_dead_cells_door_and_broker_sockets_are_swept(tmp_path: Path) -> None:
    dead = _dead_pid()
    left = [
        _left(tmp_path / f"door-estate-{dead}.sock"),  # a cell's door (runner/host.py)
        _left(tmp_path / f"egress-estate-{dead}.sock"),  # a cell's egress broker
        _left(tmp_path / f"door-cell-2-b-{dead}.sock"),  # a cell name with - and digits
        _left(tmp_path / f"egress-{dead}.sock"),  # a launcher's egress broker
    ]
    assert sweep_sockets(tmp_path) == 4
    assert [p for p in left if p.exists()] == []


def test_charter_sandbox_reap_reports_them(tmp_path: Path) -> None:
    dead = _dead_pid()
    _left(tmp_path / f"door-estate-{dead}.sock")
    _left(tmp_path / f"egress-estate-{dead}.sock")
    assert reap_host(tmp_path) == 2
    assert list(tmp_path.glob("*.sock")) == []
    # And through the command, as an operator runs it.
    _left(tmp_path / f"door-estate-{dead}.sock")
    r = subprocess.run(
        [sys.executable, "-m", "charter", "sandbox", "reap"],
        env={**os.environ, "CHARTER_SANDBOX_STATE": str(tmp_path), "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "removed 1" in r.stdout + r.stderr
    assert list(tmp_path.glob("*.sock")) == []


def test_a_live_servers_socket_is_kept_whatever_its_name(tmp_path: Path) -> None:
    dead = _dead_pid()
    # The flake's shape: a test door's random hex that is all digits, read as a pid
    # that is not alive; the door is alive and listening.
    digits = tmp_path / f"door-test-{dead}.sock"
    with _serving(digits), _serving(tmp_path / f"door-estate-{dead}.sock"):
        assert sweep_sockets(tmp_path) == 0
        assert digits.exists()
        assert (tmp_path / f"door-estate-{dead}.sock").exists()
    # Control: once the server is gone, the very same files are swept.
    assert sweep_sockets(tmp_path) == 2


def test_a_live_pid_or_a_non_socket_is_kept(tmp_path: Path) -> None:
    mine = _left(tmp_path / f"door-estate-{os.getpid()}.sock")  # its process lives
    dead = _dead_pid()
    plain = tmp_path / f"egress-{dead}.sock"
    plain.write_text("not a socket")
    other = _left(tmp_path / f"door-estate-{dead}.socket")  # not the rule's name
    assert sweep_sockets(tmp_path) == 0
    assert mine.exists()
    assert plain.exists()
    assert other.exists()


@pytest.mark.parametrize(
    ("kind", "pid", "owner", "name"),
    [
        ("egress", 4242, "", "egress-4242.sock"),
        ("door", 4242, "estate", "door-estate-4242.sock"),
        ("egress", 7, "cell-2", "egress-cell-2-7.sock"),
    ],
)
def test_the_one_rule_names_and_reads_back(kind: str, pid: int, owner: str, name: str) -> None:
    assert socket_name(kind, pid, owner) == name
    match = SOCKET_NAME.match(name)
    assert match is not None
    assert int(match["pid"]) == pid
    with pytest.raises(ValueError, match="naming rule"):
        socket_name(kind, pid, "a/b")
