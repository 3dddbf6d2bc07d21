"""Supervision benchmarks, each behind its own flag (same-run baselines).

``--cascade N``: a cascade revoke. One parent lineage with N live workers below it (each
`sleep 600` in its own real sandbox, run by one cell), revoked in one append
(`Charter.revoke`); measured from the call until no process of any of their sandboxes'
host uids is left (every sandbox frozen and killed in one pass), and until every end is
journaled. Baseline, same run: N plain `sleep 600` processes (fork/exec, no sandbox)
SIGKILLed together and reaped. The host has 1,000 sandbox uids and 2 cores: N is
what fits (a warm pool builds N sandboxes first).

Smoke-run small (``--cascade 10``). Run as root with bubblewrap installed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import Ceiling, WorkerSpec, steady_load
from charter.core import Budget, KeyStore
from charter.runner import cell_for
from charter.runner.events import WorkerEnded, WorkerStarted
from charter.sandbox import SandboxLeased

ROOT_BUDGET = Budget.parse("tokens=1000M,wall=10000h,cpu=10000h,mem=100000GiB,egress=0MB")
SLOT = Budget.parse("tokens=0,wall=600s,cpu=60s,mem=64MiB,egress=0MB")
WORKER_COST = {"tokens": 5000, "wall_ms": 700_000, "cpu_ms": 10_000, "mem_bytes": 2**26}


# -- cascade revoke -------------------------------------------------------------------------


def _alive(uids: set[int]) -> int:
    """Live (not zombie) processes running as any of ``uids``: counted here on purpose,
    not by the cell's own kill pass (``runner/_kill.py``), so the bench checks it."""
    found = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid not in uids:
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X"):
                    found += 1
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return found


def _intent(width: int, objective: str, fanout: int = 1) -> SpawnIntent:
    scale = width * max(fanout, 1)  # the parent's estimate covers its children's
    cost = {k: v * scale for k, v in WORKER_COST.items()} | {"egress_bytes": 0}
    return SpawnIntent.model_validate(
        {"width": width, "objective": objective, "estimated_cost": cost,
         "grant": {"fanout": fanout, "depth": 2}}
    )  # fmt: skip


def cascade_revoke(n: int, state: Path) -> dict[str, float]:
    """Revoke a parent with ``n`` live sandboxed workers below it (see the docstring)."""
    with tempfile.TemporaryDirectory(prefix="bench-cascade-") as tmp:
        home = Path(tmp)
        charter, _ = Charter.initialise(
            f"sqlite:///{home / 'journal.db'}",
            root="bench",
            ceiling=Ceiling(budget=ROOT_BUDGET, depth=3, fanout=100_000),
            # Declared as n cores so n sleepers (which use none) run at once: the
            # processing cap is at most cores - reserve.
            cell=CellSetup(cores=n, processing=n, coordination=1),
            keys=KeyStore(home),
            settings=Settings(),
        )
        with charter:
            charter.host_load = steady_load  # admit all n whatever the shared host's load
            policy = FixedPolicy(Verdict.POSITIVE)
            # The parent: a fan-out without a worker; the n workers below it.
            (parent,) = charter.spawn("agent:bench", _intent(1, "the revoked parent", n),
                                      policy=policy).children  # fmt: skip
            caller = charter.spawn_service().durable_caller("bench").child(parent)
            sleeper = WorkerSpec(argv=("/bin/sleep", "600"))
            charter.spawn(caller, _intent(n, "n sleeping workers to revoke"), policy=policy,
                          workers=(sleeper,))  # fmt: skip
            cell = cell_for(charter, slot_budget=SLOT, state_dir=state, ignore_host_load=True)
            cell.pool_capacity = n + 1
            stop = threading.Event()
            cell.open()
            thread = threading.Thread(target=cell.run, kwargs={"until": stop.is_set})
            thread.start()
            try:
                built = time.monotonic()
                while sum(1 for e in charter.journal.entries(types=("WorkerStarted",))
                          if isinstance(e.event, WorkerStarted)) < n:  # fmt: skip
                    if time.monotonic() - built > 60 + n:
                        types = ("WorkerStarted", "SlotAdmitted", "SlotQueued", "WorkerEnded")
                        kinds = [e.event.type_name for e in charter.journal.entries(types=types)]
                        counts = {t: kinds.count(t) for t in types}
                        raise TimeoutError(f"only some of {n} workers started: {counts}")
                    time.sleep(0.2)
                start_s = time.monotonic() - built
                uids = {
                    e.event.host_uid
                    for e in charter.journal.entries(types=("SandboxLeased",))
                    if isinstance(e.event, SandboxLeased)
                }
                assert _alive(uids) >= n
                began = time.monotonic()
                charter.revoke(parent.lineage, "the bench revokes the subtree")
                appended = time.monotonic()
                while _alive(uids):
                    time.sleep(0.001)
                gone = time.monotonic()
                while sum(1 for e in charter.journal.entries(types=("WorkerEnded",))
                          if isinstance(e.event, WorkerEnded)) < n:  # fmt: skip
                    time.sleep(0.01)
                ended = time.monotonic()
            finally:
                stop.set()
                thread.join(timeout=60)
                cell.close()
    return {
        "workers": n,
        "start_all_s": start_s,
        "revoke_append_s": appended - began,
        "revoke_to_all_gone_s": gone - began,
        "revoke_to_all_ended_s": ended - began,
    }


def plain_kill(n: int) -> float:
    """Baseline: SIGKILL ``n`` plain `sleep 600` processes together, until all reaped."""
    procs = [subprocess.Popen(["/bin/sleep", "600"]) for _ in range(n)]
    began = time.monotonic()
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--cascade",
        type=int,
        metavar="N",
        default=None,
        help="cascade revoke of N live sandboxed workers (vs plain kill)",
    )
    args = parser.parse_args()
    out: dict[str, object] = {}
    if args.cascade is not None:
        state = Path(tempfile.mkdtemp(prefix="bench-state-"))
        state.chmod(0o755)
        cascade = cascade_revoke(args.cascade, state)
        baseline = plain_kill(args.cascade)
        out["cascade"] = {
            **cascade,
            "plain_kill_s": baseline,
            "cascade_over_plain_kill": cascade["revoke_to_all_gone_s"] / baseline,
        }
    if not out:
        parser.print_help()
        return 2
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
