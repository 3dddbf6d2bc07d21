"""Issue 23 point 11: ``/proc/self/mountinfo`` shows a sandbox host paths, and
docs/sandbox.md says so among what a worker can see. Checked against a real sandbox, so
the page cannot go on promising what the kernel no longer does, or the other way round."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import Launcher

from ._support import out, sandboxed

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=128MiB,egress=0MB")
PAGE = Path(__file__).resolve().parents[2] / "docs" / "sandbox.md"
READ = "print(open('/proc/self/mountinfo').read())"


def test_mountinfo_shows_the_host_paths_the_docs_list(
    launcher: Launcher, state_dir: Path, scratch: Path
) -> None:
    workspace = scratch / "ws"
    workspace.mkdir()
    seen = sandboxed(launcher, B, READ, workspace=workspace)
    assert seen.exit_code == 0, seen.stderr
    table = out(seen)
    # What the page lists: the overlay's upper layer, named by the host's state
    # directory and the sandbox id, and the lower layer only as a descriptor.
    assert f"upperdir={state_dir}/ws/{seen.sandbox_id}/upper" in table, table
    assert re.search(r"lowerdir=/proc/self/fd/\d+", table), table
    assert str(workspace) not in table  # the workspace's own host path is not shown
    page = PAGE.read_text()
    limit = page[page.index("**Host paths and devices through `/proc/self/mountinfo`.**") :]
    limit = limit[: limit.index("\n- **")]
    assert "upperdir=STATE/ws/<sandbox id>/upper" in limit
    assert "`/proc/self/fd/N`" in limit
    # Control: without a persistent workspace no overlay, so no state path, is shown.
    private = out(sandboxed(launcher, B, READ))
    assert "upperdir=" not in private
    assert str(state_dir) not in private
