"""Freeze, then kill, observed (real sandboxes, both backends): a revoked subtree of
two busy workers (each spinning and forking) is killed by the cell, and at the very
moment the first SIGKILL is sent (recorded as the kill module sends it) every one of
their sandboxes reads frozen in its cgroup freezer with its processes still there: the
freeze came first, and the kill after it, never the other way round. The control: just
before the revoke none of them was frozen (they were running, counting)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.core import Budget
from charter.runner import _kill
from charter.runner.events import WorkerEnded
from charter.sandbox import SandboxControl, SandboxLeased
from tests.runner._support import COST, alive_under, make_cell, running, until_idle
from tests.runner._watching import spec_of
from tests.runner.conftest import initialise
from tests.runner.programs import python

# Spins, and forks a short-lived child every few ms (a kill must not race a fork).
BUSY = """
import os, time
while True:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.002)
"""


@pytest.mark.sandbox
def test_every_sandbox_is_frozen_before_the_first_sigkill(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=2) as charter:
        # A fan-out without a worker, and two busy workers below it.
        top = SpawnIntent.model_validate(
            {"width": 1, "objective": "a parent of two busy workers", "estimated_cost": COST,
             "grant": {"fanout": 4, "depth": 2}}
        )  # fmt: skip
        (parent,) = charter.spawn(
            "agent:estate", top, policy=FixedPolicy(Verdict.POSITIVE)
        ).children
        below = charter.spawn_service().durable_caller("estate").child(parent)
        intent = SpawnIntent(
            width=2, objective="two busy workers to revoke with their parent",
            estimated_cost=Budget.parse("tokens=20k,wall=2m,cpu=2m,mem=512MiB,egress=0"),
        )  # fmt: skip
        result = charter.spawn(
            below, intent, policy=FixedPolicy(Verdict.POSITIVE), workers=(python(BUSY),)
        )
        lineages = [str(c.lineage) for c in result.children]
        seen: list[dict[str, object]] = []
        signalled: list[int] = []

        class Os:
            """The kill module's ``os``, its ``kill`` looking first (the first SIGKILL
            of the cascade is sent here, whichever way the sandbox is killed)."""

            def __getattr__(self, name: str) -> object:
                return getattr(os, name)

            def kill(self, pid: int, sig: int) -> None:
                if not seen:
                    seen.append(
                        {
                            "frozen": {x: controls[x].frozen() for x in lineages},
                            "alive": {x: bool(alive_under({uid_of[x]})) for x in lineages},
                        }
                    )
                signalled.append(pid)
                os.kill(pid, sig)

        monkeypatch.setattr(_kill, "os", Os())
        with running(make_cell(charter, None, state_dir)) as cell:
            specs = {x: spec_of(cell, x) for x in lineages}
            controls = {x: SandboxControl(s) for x, s in specs.items()}
            uid_of = {x: s.host_uid for x, s in specs.items()}
            before = {x: c.frozen() for x, c in controls.items()}
            charter.revoke(str(parent.lineage), "the test revokes the subtree")  # one append
            until_idle(cell, 60)
        entries = list(charter.journal.entries())
    assert before == dict.fromkeys(lineages, False)  # the control: running, not frozen
    assert seen, "no kill pass was made"
    (first,) = seen
    assert len(signalled) >= 2 * 2  # each sandbox's stub and worker at least
    assert first["frozen"] == dict.fromkeys(lineages, True)
    assert first["alive"] == dict.fromkeys(lineages, True)  # killed after, while there
    ends = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
    assert {x: ends[x].outcome for x in lineages} == dict.fromkeys(lineages, "killed")
    uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}
    assert alive_under(uids) == []
