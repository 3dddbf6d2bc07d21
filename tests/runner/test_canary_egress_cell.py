"""The decoy egress destination, through the cell (real sandboxes, both backends): a
worker that dials its own sandbox's decoy destination through the egress broker is
quarantined by the cell's sampler, the verdict naming the canary and committed within
1 s of the dial; then it is killed (after the verdict) and its subtree revoked (its
running child killed, a mint below it refused). The control, a sibling dialing a decoy
that is not its own (the same shape, another token), is refused by the broker like any
ungranted destination and gets no verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from charter.authority import LineageRevoked
from charter.runner.events import WorkerEnded, WorkerKilled, WorkerResult
from charter.sandbox import SandboxLeased
from charter.supervision import CanariesPlanted, QuarantineVerdict, SupervisionPolicy
from tests.runner._support import (
    alive_under,
    fan_out,
    make_cell,
    mint_below_is_refused,
    running,
    until_idle,
)
from tests.runner._watching import spec_of, started, touch_in_workspace, until, verdicts_on
from tests.runner.conftest import initialise
from tests.runner.programs import COST, PRELUDE, PY, python
from tests.runner.test_supervise import replay

# argv[1]: "decoy" dials its own sandbox's decoy destination, "other" one of the same
# shape that is no canary of its. The decoy dialer first spawns a child that sleeps,
# and dials once the test has seen the child run (the go-ahead file).
DIALER = (
    PRELUDE
    + f"""
import os, socket, time
mine = sys.argv[1] == "decoy"
if mine:
    door = charter_door.Door()
    door.spawn({{"width": 1, "objective": "a child that is revoked with its parent",
                "estimated_cost": {{"tokens": 10_000, **{COST!r}}}}},
               [{{"argv": ["{PY}", "-I", "-c", "import time; time.sleep(600)"]}}])
    while not os.path.exists("/workspace/go"):
        time.sleep(0.02)
# Listing the decoy's directory opens no decoy: its name gives the token.
(name,) = os.listdir("/workspace/.charter-secrets")
token = name.removeprefix("deploy-").removesuffix(".ini") if mine else "0" * 12
host = f"vault-{{token}}.charter-canary.invalid:443"
print(time.time_ns(), flush=True)
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["CHARTER_EGRESS_SOCKET"])
s.sendall(f"CONNECT {{host}} HTTP/1.1\\r\\nHost: {{host}}\\r\\n\\r\\n".encode())
reply = b""
while b"\\r\\n\\r\\n" not in reply and (chunk := s.recv(4096)):
    reply += chunk
print(reply.split(b" ")[1].decode() if reply else "none", flush=True)
time.sleep(5 if mine else 0)
"""
)


@pytest.mark.sandbox
def test_dialing_the_decoy_destination_quarantines_kills_and_revokes_the_subtree(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home", processing=3) as charter:
        result = fan_out(
            charter, 2, python(DIALER, "decoy"), python(DIALER, "other"), fanout=4, depth=2
        )
        dialer, control = (str(c.lineage) for c in result.children)
        child = f"{dialer}/sa-1"
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            spec = spec_of(cell, dialer)
            until("the child running", lambda: started(charter.journal, child), 90)
            touch_in_workspace(spec, "go")
            until("the quarantine", lambda: verdicts_on(charter.journal, dialer), 30)
            until_idle(cell, 60)
        mint_below_is_refused(charter, result.children[0])  # a mint under it loses
        entries = list(charter.journal.entries())
    (quarantine,) = [e for e in entries if isinstance(e.event, QuarantineVerdict)]
    assert quarantine.event.lineage == dialer  # the control got none
    planted = next(
        e.event
        for e in entries
        if isinstance(e.event, CanariesPlanted) and e.event.lineage == dialer
    )
    evidence = quarantine.event.evidence[0]
    assert evidence.canary == f"egress_destination:{planted.egress_destination}"
    # Committed within 1 s of the dial (the dialer printed the host clock just before).
    results = {e.event.lineage: e.event.text for e in entries if isinstance(e.event, WorkerResult)}
    dialed_at = int(results[dialer].split()[0]) / 1e9  # its output is its answer
    latency = quarantine.recorded_at.timestamp() - dialed_at
    assert 0 <= latency <= 1.0, latency
    assert results[control].split()[1] == "403"  # refused like any ungranted name
    dialed = [e for e in entries if isinstance(e.event, WorkerKilled) and e.event.lineage == dialer]
    (killed,) = dialed
    assert quarantine.position < killed.position  # the verdict, then the act
    (revoked,) = [e for e in entries if isinstance(e.event, LineageRevoked)]
    assert str(revoked.event.lineage) == dialer
    assert quarantine.position < revoked.position
    ends = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
    assert ends[dialer].outcome == "killed"
    assert ends[dialer].reason.startswith("quarantine verdict (touched canary egress_destination")
    assert ends[child].outcome == "killed"  # its subtree, revoked and killed
    assert ends[control].outcome == "exited"
    assert ends[control].exit_code == 0
    uids = {e.event.host_uid for e in entries if isinstance(e.event, SandboxLeased)}
    assert alive_under(uids) == []
    replay(entries, SupervisionPolicy())
