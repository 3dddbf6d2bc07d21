"""Every named sandbox error, raised for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from charter.ledger.budget import Budget
from charter.ledger.errors import RefusedError, UnavailableError
from charter.sandbox import (
    HostCannotIsolateError,
    Launcher,
    SandboxUnavailableError,
    UidPoolExhaustedError,
    WarmPool,
)
from charter.sandbox._host import UID_RANGE, allocate_uid

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
        Launcher(state_dir=state_dir, bwrap=missing, unsafe_skip_isolation_probe=True).run(
            B, ["/bin/true"]
        )
    assert isinstance(err.value, UnavailableError)
    # Without the (unsafe) skip, the launcher is refused before it could try.
    with pytest.raises(HostCannotIsolateError):
        Launcher(state_dir=state_dir, bwrap=missing)
    with pytest.raises(SandboxUnavailableError):
        WarmPool(scratch / "no-such-template", B, 1, state_dir=state_dir)
    # Control: the real bwrap runs the same command.
    assert Launcher(state_dir=state_dir).run(B, ["/bin/true"]).exit_code == 0
