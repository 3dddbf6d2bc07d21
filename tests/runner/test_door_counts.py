"""The door's per-worker counts, as supervision samples them (real sandboxes, both
backends): a worker that asks its door for two spawns (widths 1 and 2), three
signatures and one answer of 1,234 bytes is sampled, live and in its journaled profile
(``WorkerProfiled``, the peak of its samples), with exactly those values: spawn_calls
2, spawn_width 2, sign_calls 3, result_bytes 1234. The control, a sibling sampled
beside it that never used its door, has every count at 0 (the counts are per worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from charter.control import WorkerSpec
from charter.supervision import Signal, WorkerProfiled
from tests.runner._support import fan_out, make_cell, running, until_idle
from tests.runner._watching import ended, spec_of, touch_in_workspace, until
from tests.runner.conftest import initialise
from tests.runner.programs import COST, PRELUDE, python

DOOR_USER = (
    PRELUDE
    + f"""
import os, time
door = charter_door.Door()
for width in (1, 2):
    door.spawn({{"width": width, "objective": "children to count the door's calls by",
                "estimated_cost": {{"tokens": 10_000 * width, **{COST!r}}}}},
               [{{"argv": ["/bin/true"]}}])
for i in range(3):
    door.sign("count/v1", b"message %d" % i)
door.result("r" * 1234)
while not os.path.exists("/workspace/done"):  # sampled meanwhile; the test says when
    time.sleep(0.02)
"""
)
QUIET = "import os, time\nwhile not os.path.exists('/workspace/done'):\n    time.sleep(0.02)\n"
COUNTS = (Signal.SPAWN_CALLS, Signal.SPAWN_WIDTH, Signal.SIGN_CALLS, Signal.RESULT_BYTES)
WANT = dict(zip(COUNTS, (2, 2, 3, 1234), strict=True))


@pytest.mark.sandbox
def test_the_doors_counts_are_sampled_as_the_worker_made_them(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=2) as charter:
        result = fan_out(
            charter, 2,
            WorkerSpec(argv=python(DOOR_USER).argv, task_class="counted"),
            WorkerSpec(argv=python(QUIET).argv, task_class="counted"),
            fanout=4, depth=2,
        )  # fmt: skip
        user, quiet = (str(c.lineage) for c in result.children)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            sup = cell.supervisor
            assert sup is not None
            specs = {x: spec_of(cell, x) for x in (user, quiet)}

            def live(lineage: str) -> dict[Signal, int]:
                obs = sup.observation(lineage)
                return {} if obs is None else {k: obs.signals.value(k) for k in COUNTS}

            # Its answer is its last call: once sampled, every count is final.
            until("the answer sampled", lambda: live(user).get(Signal.RESULT_BYTES) == 1234, 60)
            until("the sibling sampled", lambda: sup.observation(quiet) is not None, 30)
            assert live(user) == WANT
            assert live(quiet) == dict.fromkeys(COUNTS, 0)  # the control
            for spec in specs.values():
                touch_in_workspace(spec, "done")
            until("both ends", lambda: ended(charter.journal, {user, quiet}), 60)
            until_idle(cell, 60)
        profiles = {
            e.event.lineage: e.event.profile
            for e in charter.journal.entries(types=(WorkerProfiled.type_name,))
            if isinstance(e.event, WorkerProfiled)
        }
    assert {k: profiles[user].value(k) for k in COUNTS} == WANT
    assert {k: profiles[quiet].value(k) for k in COUNTS} == dict.fromkeys(COUNTS, 0)
