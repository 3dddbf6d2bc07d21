"""One fan-out per request id, whoever retries it: two processes and two threads in
each, all spawning with the same request id at once, commit exactly one fan-out; the
callers handed grants are handed exactly the journaled ones (the committed outcome),
every other caller a clear refusal (BatchCommittedError naming the committed positions). Both
backends; the independent fold after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from charter.authority import GrantMinted
from charter.control import register_root
from charter.core import KeyStore
from charter.ledger import Journal
from tests.invariants import check_history, journal_history

from ._support import ceiling

ROOT_DIR = Path(__file__).resolve().parents[2]
REQUEST = "retry"
TRIALS = 4

# Two threads spawn with REQUEST at once (after a shared start signal); each prints
# what it was handed: the grants (body and signature) or the error's name.
CALLER = """
import json, os, sys, threading
from pathlib import Path
from charter.app import Charter
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.core import Budget, KeyStore
url, home, start, request = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
intent = SpawnIntent(width=3, objective="scan the estate host by host",
                     estimated_cost=Budget.parse("tokens=30k,wall=3m,cpu=3m,mem=96MiB,egress=3MB"))
out = []
def call():
    with Charter.open(url, keys=KeyStore(home)) as charter:
        while not os.path.exists(start):
            pass
        try:
            r = charter.spawn("agent:root", intent, policy=FixedPolicy(Verdict.POSITIVE),
                              request_id=request)
            grants = [[c.sealed.body.decode(), c.sealed.signature.hex()] for c in r.children]
            out.append({"grants": grants})
        except BaseException as e:
            out.append({"error": type(e).__name__})
threads = [threading.Thread(target=call) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(out))
"""


def test_four_callers_retrying_one_request_id_commit_one_fan_out(
    journal_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    with Journal.create(journal_url) as journal:
        register_root(journal, KeyStore(home), "root", ceiling())
    env = {**os.environ, "PYTHONPATH": str(ROOT_DIR)}
    for trial in range(TRIALS):
        request = f"{REQUEST}{trial}"
        start = tmp_path / f"go{trial}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CALLER, journal_url, str(home), str(start), request],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(2)
        ]
        start.touch()
        outs = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr
            outs.extend(json.loads(stdout))
        handed = [o["grants"] for o in outs if "grants" in o]
        refused = [o["error"] for o in outs if "error" in o]
        with Journal.open(journal_url) as journal:
            minted = [
                [e.event.body, e.event.signature]
                for e in journal.entries(types=("GrantMinted",))
                if isinstance(e.event, GrantMinted) and e.event.fanout == request
            ]
        assert len(minted) == 3, (trial, outs)  # one fan-out of 3, once
        # Every caller handed grants holds exactly the journaled ones (a retry whose
        # decision came out byte for byte the same is handed the committed outcome);
        # every other caller is told, clearly.
        assert handed
        assert all(grants == minted for grants in handed)
        assert refused == ["BatchCommittedError"] * (4 - len(handed))
    with Journal.open(journal_url) as journal:
        assert check_history(journal_history(journal)).problems == []
