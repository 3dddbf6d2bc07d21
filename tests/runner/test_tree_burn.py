"""``charter tree`` shows a running worker's burn from the projections: its latest
``WorkerSampled`` while it runs (not 0 until its end), then what its lease was charged
(the usage its sandbox measured) once it ended; ``--json`` and ``--as-of`` included. At
every journal position the projection (incremental, stepped and rebuilt alike) equals an
independent fold of the samples, ends and charges (real sandbox, both backends)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from charter.budgets import UsageRecorded
from charter.control import WorkerSpec
from charter.ledger import Journal
from charter.projections import Projector
from charter.runner.events import WorkerEnded
from charter.sandbox import SandboxExited
from charter.supervision import WorkerSampled
from tests.runner._support import ROOT_DIR, fan_out, make_cell, running, until_idle
from tests.runner._watching import spec_of, touch_in_workspace
from tests.runner.conftest import initialise

# Burns CPU until the test has read the tree (the file "stop"), at most 60 s.
BUSY = (
    "/bin/sh", "-c",
    "end=$(($(date +%s) + 60)); "
    "while [ ! -e /workspace/stop ] && [ $(date +%s) -lt $end ]; do :; done",
)  # fmt: skip

Burn = tuple[str, int, int, int, int | None]  # source, cpu_ms, wall_ms, mem_bytes, position


def _cli(url: str, home: Path, *args: str, as_json: bool = True) -> Any:
    env = {k: v for k, v in os.environ.items() if k != "CHARTER_DB"}
    env |= {"CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT_DIR)}
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, *(("--json",) if as_json else ()), *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if as_json else done.stdout


def _node(tree: dict[str, Any], lineage: str) -> dict[str, Any]:
    (node,) = [n for n in tree["nodes"] if n["lineage"] == lineage]
    return node


def _expected(journal: Journal, lineage: str) -> dict[int, Burn]:
    """Per position, ``lineage``'s burn folded here from the events as the design says:
    its newest sample while it has not ended, else the sum of its lease's charges."""
    spent = [0, 0, 0]  # cpu, wall, mem
    sample: WorkerSampled | None = None
    sampled_at = 0
    ended = False
    out: dict[int, Burn] = {}
    for entry in journal.entries():
        event = entry.event
        if isinstance(event, WorkerSampled) and event.lineage == lineage and not ended:
            sample, sampled_at = event, entry.position
        elif isinstance(event, WorkerEnded) and event.lineage == lineage:
            ended, sample = True, None
        elif isinstance(event, UsageRecorded) and str(event.lineage) == lineage:
            spent[0] += event.amount.cpu_ms
            spent[1] += event.amount.wall_ms
            spent[2] += event.amount.mem_bytes
        if sample is not None:
            out[entry.position] = ("sampled", sample.cpu_ms, sample.wall_ms,
                                   sample.memory_bytes, sampled_at)  # fmt: skip
        else:
            out[entry.position] = ("charged", spent[0], spent[1], spent[2], None)
    return out


def _shown(projector: Projector, lineage: str, position: int) -> Burn | None:
    nodes = [n for n in projector.tree(as_of=position).nodes if n.lineage == lineage]
    if not nodes or nodes[0].burn is None:
        return None
    b = nodes[0].burn
    return (b.source, b.cpu_ms, b.wall_ms, b.mem_bytes,
            b.position if b.source == "sampled" else None)  # fmt: skip


def _sampled(journal: Journal, lineage: str) -> list[int]:
    return [
        e.position
        for e in journal.entries(types=(WorkerSampled.type_name,))
        if isinstance(e.event, WorkerSampled) and e.event.lineage == lineage
    ]


@pytest.mark.sandbox
def test_charter_tree_shows_a_running_workers_burn_then_its_charge(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with initialise(journal_url, home, processing=1) as charter:
        (child,) = fan_out(charter, 1, WorkerSpec(argv=BUSY)).children
        lineage = str(child.lineage)
        with running(make_cell(charter, None, state_dir)) as cell:
            deadline = time.monotonic() + 60
            while not _sampled(charter.journal, lineage):
                assert time.monotonic() < deadline, "no WorkerSampled was journaled"
                time.sleep(0.05)
            live = _cli(journal_url, home, "tree")  # a fresh process, as an operator asks
            text = _cli(journal_url, home, "tree", as_json=False)
            touch_in_workspace(spec_of(cell, lineage), "stop")
            until_idle(cell, 60)
        node = _node(live, lineage)
        assert node["worker"] == "running"  # read while it burns
        assert node["burn"]["source"] == "sampled"
        assert node["burn"]["cpu_ms"] > 50, node  # not 0 until its end
        assert "so far" in text
        entries = list(charter.journal.entries())
        samples = {e.position: e.event for e in entries if isinstance(e.event, WorkerSampled)}
        # What --json showed is the journaled sample it was read at, exactly.
        shown = samples[node["burn"]["position"]]
        assert (node["burn"]["cpu_ms"], node["burn"]["wall_ms"], node["burn"]["mem_bytes"]) == (
            shown.cpu_ms, shown.wall_ms, shown.memory_bytes
        )  # fmt: skip
        # After its end: what its sandbox measured, charged to its lease.
        (exited,) = [e.event for e in entries if isinstance(e.event, SandboxExited)]
        final = _node(_cli(journal_url, home, "tree"), lineage)
        assert final["worker"] == "exited"
        assert final["burn"]["source"] == "charged"
        assert (final["burn"]["cpu_ms"], final["burn"]["wall_ms"]) == (
            exited.usage.cpu_ms, exited.usage.wall_ms
        )  # fmt: skip
        assert final["burn"]["cpu_ms"] >= node["burn"]["cpu_ms"]
        # --as-of the first sample's position: that sample, though the worker has ended.
        first = min(samples)
        at_first = _node(_cli(journal_url, home, "tree", "--as-of", str(first)), lineage)
        assert at_first["worker"] == "running"
        assert at_first["burn"]["source"] == "sampled"
        assert at_first["burn"]["position"] == first
        assert at_first["burn"]["cpu_ms"] == samples[first].cpu_ms
        # Just before it: nothing sampled yet, nothing charged yet.
        before = _node(_cli(journal_url, home, "tree", "--as-of", str(first - 1)), lineage)
        assert before["burn"]["source"] == "charged"
        assert before["burn"]["cpu_ms"] == 0
        # Every position, three ways, against the independent fold.
        want = _expected(charter.journal, lineage)
        incremental = Projector(charter.journal, "inc")
        stepped = Projector(charter.journal, "step")
        rebuilt = Projector(charter.journal, "reb")
        try:
            incremental.catch_up()
            rebuilt.rebuild()
            seen = set()
            for position, expected in want.items():
                assert stepped.catch_up(stop=position) == position
                for projector in (incremental, stepped, rebuilt):
                    got = _shown(projector, lineage, position)
                    if got is not None:  # from its grant's position on
                        assert got == expected, (projector.tracking_name, position)
                        seen.add(expected[0])
            assert seen == {"sampled", "charged"}  # the history passed through both
        finally:
            for projector in (incremental, stepped, rebuilt):
                projector.close()
