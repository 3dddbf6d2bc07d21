"""An operator's ``resume`` changes how the supervisor decides on that worker afterwards
(real sandboxes, both backends). A worker of a taught class writes 4 MiB to its
workspace and is paused by the supervisor; an operator resumes it from another process
(`charter verdict LINEAGE resume`). From then on the same evidence never pauses it
again (sampled over and over, no verdict, although the same observation would pause a
worker with nothing accepted: the control), and more of it (16 MiB more, past the
rule's threshold over the level the operator accepted) pauses it again, its evidence
held against that level. A fold of the journal from zero reproduces every verdict."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from charter.control import WorkerSpec
from charter.runner._supervise import POLICY_FILE, load_policy
from charter.sandbox import SandboxControl
from charter.supervision import PauseVerdict, ResumeVerdict, Signal, decide
from tests.runner._support import cli_env, fan_out, make_cell, running, until_idle
from tests.runner._watching import ended, spec_of, touch_in_workspace, until, verdicts_on
from tests.runner.conftest import initialise
from tests.runner.programs import PY
from tests.runner.test_supervise import replay

HONEST = "import time; time.sleep(0.3)"
# 4 MiB at once; 16 MiB more once the test says so (the file "more"); then it idles.
WRITER = """
import os, time
open('/workspace/a', 'wb').write(b'x' * (4 << 20))
while not os.path.exists('/workspace/more'):
    time.sleep(0.02)
open('/workspace/b', 'wb').write(b'x' * (16 << 20))
time.sleep(600)
"""


def _spec(source: str) -> WorkerSpec:
    return WorkerSpec(argv=(PY, "-I", "-c", source), task_class="writer")


@pytest.mark.sandbox
def test_an_operators_resume_is_not_undone_by_the_same_evidence(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / POLICY_FILE).write_text(json.dumps({"version": 4, "min_completed": 3}))
    policy = load_policy(home)
    with initialise(journal_url, home, processing=2) as charter:
        cell = make_cell(charter, None, state_dir)
        with running(cell):
            sup = cell.supervisor
            assert sup is not None
            teachers = {str(c.lineage) for c in fan_out(charter, 4, *[_spec(HONEST)] * 4).children}
            until("the teachers' ends", lambda: ended(charter.journal, teachers), 120)
            until("the class taught", lambda: sup.baselines.get("writer") is not None, 30)
            (writer,) = (str(c.lineage) for c in fan_out(charter, 1, _spec(WRITER)).children)
            spec = spec_of(cell, writer)
            control = SandboxControl(spec)
            until("the supervisor's pause", lambda: verdicts_on(charter.journal, writer), 60)
            until("the pause carried out", control.frozen, 30)
            done = subprocess.run(
                [sys.executable, "-m", "charter", "--db", journal_url, "--json", "verdict",
                 writer, "resume", "--reason", "I looked: it is fine"],
                env=cli_env(home, state_dir), capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            resumed_at = int(json.loads(done.stdout)["position"])
            until("the thaw", lambda: not control.frozen(), 30)
            thawed = time.monotonic()
            # The same evidence, sampled again and again while it runs: no verdict.
            until(
                "eight samples after the thaw",
                lambda: sum(t > thawed for t in sup.sample_times(writer)) >= 8,
                30,
            )
            same = sup.observation(writer)
            after = [e for e in verdicts_on(charter.journal, writer) if e.position > resumed_at]
            assert after == []
            # More of it: paused again.
            touch_in_workspace(spec, "more")
            until(
                "the second pause",
                lambda: [
                    e for e in verdicts_on(charter.journal, writer) if e.position > resumed_at
                ],
                60,
            )
            until("the second pause carried out", control.frozen, 30)
            cell.kill(writer, "the test is done with it")
            until_idle(cell, 60)
        entries = list(charter.journal.entries())
    verdicts = [e.event for e in entries if getattr(e.event, "lineage", None) == writer
                and type(e.event).type_name.endswith("Verdict")]  # fmt: skip
    first, operators, second = verdicts
    assert isinstance(first, PauseVerdict)
    assert isinstance(operators, ResumeVerdict)
    assert operators.evidence[0].signal == "operator"
    assert isinstance(second, PauseVerdict)
    ws = Signal.WORKSPACE_BYTES
    level = next(e.observed for e in first.evidence if e.signal == ws)
    assert level >= 4 << 20
    # The control: what it was sampled at after the resume would pause a worker that
    # had nothing accepted (the evidence alone still triggers the rule).
    assert same is not None
    assert same.signals.value(ws) >= level
    baseline = sup.baselines["writer"]
    assert isinstance(decide(same, baseline, policy), PauseVerdict)
    # The second pause: decided on the new evidence, held against the accepted level.
    (held,) = [e for e in second.evidence if e.signal == ws]
    assert held.upper == level
    assert held.observed > held.threshold >= 3 * level
    replay(entries, policy)
