"""Every named sandbox error, raised for real."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import charter.sandbox._janitor as janitor
from charter.core import Budget, RefusedError, UnavailableError
from charter.sandbox import (
    HostCannotIsolateError,
    Launcher,
    SandboxBudgetError,
    SandboxUnavailableError,
    UidPoolExhaustedError,
    WarmPool,
)
from charter.sandbox._host import UID_RANGE, allocate_uid
from charter.sandbox._launch import RawLauncher

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=5s,cpu=5s,mem=64MiB,egress=0MB")


def test_uid_pool_exhaustion_is_a_refusal(tmp_path: Path) -> None:
    held = [allocate_uid(tmp_path) for _ in range(UID_RANGE)]
    try:
        assert len({lease.uid for lease in held}) == UID_RANGE  # unique per live sandbox
        with pytest.raises(UidPoolExhaustedError) as refused:
            allocate_uid(tmp_path)
        assert isinstance(refused.value, RefusedError)
    finally:
        for lease in held:
            lease.release()
    allocate_uid(tmp_path).release()  # control: released uids are free again


def test_a_missing_backend_is_unavailable(state_dir: Path, scratch: Path) -> None:
    missing = str(scratch / "no-such-bwrap")
    with pytest.raises(SandboxUnavailableError) as err:
        RawLauncher(state_dir=state_dir, bwrap=missing).run(B, ["/bin/true"])
    assert isinstance(err.value, UnavailableError)
    # The public launcher probes first: it is refused before it could try.
    with pytest.raises(HostCannotIsolateError):
        Launcher(state_dir=state_dir, bwrap=missing)
    with pytest.raises(SandboxUnavailableError):
        WarmPool(scratch / "no-such-template", B, 1, state_dir=state_dir)
    # Control: the real bwrap runs the same command.
    assert Launcher(state_dir=state_dir).run(B, ["/bin/true"]).exit_code == 0


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_failures_after_the_uid_is_taken_leak_nothing(state_dir: Path, scratch: Path) -> None:
    """A slot that cannot be made, or a captured cold run that cannot start, gives back
    its uid lock, its directory and every fd it opened."""
    janitor.drain()
    fds, slots = _open_fds(), set((state_dir / "slots").glob("*"))
    unrunnable = Budget.parse("tokens=0,wall=0s,cpu=5s,mem=64MiB,egress=0MB")
    with (
        WarmPool(scratch, unrunnable, 1, state_dir=state_dir) as pool,
        pytest.raises(SandboxBudgetError),
    ):
        pool.fill()  # compile_spec refuses, after the uid and the slot directory
    missing = str(scratch / "no-such-bwrap")
    launcher = RawLauncher(state_dir=state_dir, bwrap=missing)
    with pytest.raises(SandboxUnavailableError):
        launcher.run(B, ["/bin/true"], capture=True)  # after the capture memfds
    janitor.drain()
    assert _open_fds() == fds  # the uid flocks and the memfds are closed
    assert set((state_dir / "slots").glob("*")) == slots
    # Control: every uid of the range can still be held, so none was kept.
    held = [allocate_uid(state_dir) for _ in range(UID_RANGE)]
    for lease in held:
        lease.release()
