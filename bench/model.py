"""The model door's overhead per call, against a direct call to the same loopback server.

A worker in a real sandbox makes N chat completions through its model door
(``/run/charter/model.sock``: reserved, journaled, forwarded, settled), each on one
keep-alive connection, timing each call (non-streamed: the whole answer; streamed: the
time to its first token, then the rest read). The baseline is the same client code
making the same N calls straight to the same loopback server (the tests' own
OpenAI-compatible server, stdlib http.server, in a process of its own) from the host.
Reported: p50 and p90 of each, and the door's added p50 (target <= 2 ms),
non-streamed and time-to-first-token; and the CPU the door's thread spends per call
(thread time in the door's request handler: reading, reserving, forwarding, relaying,
settling), which a loaded machine inflates less than it does wall-clock figures. The
journal is SQLite: a call drawn from its lease's block of tokens appends nothing on its
path (one in ``BLOCK_CALLS`` holds the next block first); each settlement is one WAL
commit by the door's settler, off the calls' path.

Run as root with bubblewrap: ``python3 bench/model.py [--calls N]``. Exits 1 when a
target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._support import percentile
from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import Ceiling, WorkerSpec
from charter.core import Budget, KeyStore
from charter.runner import model as _model
from charter.runner import run_cell
from charter.runner.model import configure_endpoint

ROOT_BUDGET = Budget.parse("tokens=1000M,wall=10000h,cpu=10000h,mem=100000GiB,egress=10GB")
SLOT = Budget.parse("tokens=0,wall=600s,cpu=600s,mem=256MiB,egress=1GB")
COST = {
    "tokens": 100_000_000,
    "wall_ms": 600_000,
    "cpu_ms": 600_000,
    "mem_bytes": 2**28,
    "egress_bytes": 10**9,
}
PY = "/usr/bin/python3"
TARGET_MS = 2.0

# The client both sides run: N calls on one connection, each timed (ms); streamed, the
# time to the first content chunk. ``connect`` is the connection factory.
CLIENT = """
import json, time
def calls(connect, n, stream):
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hello there"}],
                       "max_tokens": 8, "stream": stream,
                       **({"stream_options": {"include_usage": True}} if stream else {})})
    conn = connect()
    took = []
    for _ in range(n):
        start = time.perf_counter()
        conn.request("POST", PATH, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if stream:
            first = None
            while True:
                line = r.readline()
                if not line:
                    break
                if first is None and b'"content"' in line:
                    first = time.perf_counter()
            took.append((first - start) * 1000)
        else:
            r.read()
            took.append((time.perf_counter() - start) * 1000)
        assert r.status == 200, r.status
    conn.close()
    return took
"""

WORKER = (
    "import sys, json; sys.path.insert(0, '/workspace'); import charter_door\n"
    + CLIENT.replace("PATH", repr("/v1/chat/completions"))
    + """
n = int(sys.argv[1])
out = {"whole": calls(charter_door.ModelConnection, n, False),
       "first_token": calls(charter_door.ModelConnection, n, True)}
charter_door.Door().result(json.dumps({k: [round(x, 3) for x in v] for k, v in out.items()}))
"""
)


# The loopback server in a process of its own (as a model server is): it shares no
# interpreter lock with the door's threads or the direct client. Serves until its
# stdin closes.
SERVER = """
import sys
from tests.runner._model_server import Behaviour, model_server
with model_server(Behaviour(length=8)) as (url, _):
    print(url, flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def _server() -> Iterator[str]:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env=env, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


def _direct(url: str, n: int) -> dict[str, list[float]]:
    parts = urlsplit(url)
    scope: dict[str, Any] = {}
    exec(CLIENT.replace("PATH", repr(parts.path + "/chat/completions")), scope)

    def connect() -> http.client.HTTPConnection:
        return http.client.HTTPConnection(parts.hostname or "", parts.port)

    return {
        "whole": scope["calls"](connect, n, False),
        "first_token": scope["calls"](connect, n, True),
    }


def _timed_requests(cpu: list[float]) -> Callable[[], None]:
    """Record the door thread's CPU (ms) per request in ``cpu``; returns the undo."""
    served = _model.ModelDoor._one_request

    def timed(self: _model.ModelDoor, *args: Any, **kwargs: Any) -> bool:
        start = time.thread_time()
        try:
            return served(self, *args, **kwargs)
        finally:
            cpu.append((time.thread_time() - start) * 1000)

    _model.ModelDoor._one_request = timed  # type: ignore[method-assign]

    def undo() -> None:
        _model.ModelDoor._one_request = served  # type: ignore[method-assign]

    return undo


def _through_door(url: str, n: int, state: Path) -> dict[str, list[float]]:
    home = Path(tempfile.mkdtemp(prefix="bench-model-"))
    charter, _ = Charter.initialise(
        f"sqlite:///{home / 'journal.db'}",
        root="bench",
        ceiling=Ceiling(budget=ROOT_BUDGET, depth=3, fanout=10),
        cell=CellSetup(cores=os.cpu_count() or 1, processing=1, coordination=1),
        keys=KeyStore(home),
        settings=Settings(),
    )
    with charter:
        configure_endpoint(home, url, None)
        intent = SpawnIntent.model_validate(
            {"width": 1, "objective": "call the model through the door for the bench",
             "estimated_cost": COST}
        )  # fmt: skip
        spec = WorkerSpec(argv=(PY, "-I", "-c", WORKER, str(n)))
        charter.spawn("agent:bench", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=(spec,))
        cell = charter.cell(slot_budget=SLOT, state_dir=state, ignore_host_load=True)
        run_cell(cell, once=True)
        (end,) = [e.event for e in charter.journal.entries(types=("WorkerEnded",))]
        results = [e.event for e in charter.journal.entries(types=("WorkerResult",))]
        reason = results[0].text if results else end.reason  # type: ignore[attr-defined]
        settled = sum(1 for _ in charter.journal.entries(types=("ModelCallSettled",)))
    if settled != 2 * n:
        raise RuntimeError(f"{settled} calls settled of {2 * n}: {reason[:400]}")
    said: dict[str, list[float]] = json.loads(reason)
    return said


def _raw_commits(n: int) -> list[float]:
    """The raw library's floor: one row committed by sqlite3 (WAL, synchronous=FULL, as
    the journal), per commit (ms). The door's settler commits once per call."""
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "raw.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (x BLOB)")
        took = []
        for _ in range(n):
            start = time.perf_counter()
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 400,))
            conn.execute("COMMIT")
            took.append((time.perf_counter() - start) * 1000)
        conn.close()
    return took


def _figures(samples: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(samples, 0.5), 3), "p90": round(percentile(samples, 0.9), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls of each kind")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="bench-model-state-"))
    state.chmod(0o755)
    cpu: list[float] = []
    with _server() as url:
        direct = _direct(url, args.calls)
        undo = _timed_requests(cpu)
        try:
            door = _through_door(url, args.calls, state)
        finally:
            undo()
    commit = _figures(_raw_commits(args.calls))
    report: dict[str, Any] = {
        "calls": args.calls,
        "load_average": round(os.getloadavg()[0], 2),
        "raw_sqlite_commit_ms": commit,
    }
    # The door served each connection's calls, then saw its end (one more request
    # read, nothing served): the whole calls first, then the streamed.
    served = {"whole": cpu[: args.calls], "first_token": cpu[args.calls + 1 : 2 * args.calls + 1]}
    for kind in ("whole", "first_token"):
        d, m = _figures(direct[kind]), _figures(door[kind])
        report[kind] = {
            "direct_ms": d,
            "door_ms": m,
            "added_p50_ms": round(m["p50"] - d["p50"], 3),
            "door_cpu_per_call_ms": _figures(served[kind]),
        }
    print(json.dumps(report, indent=2))
    missed = [k for k in ("whole", "first_token") if report[k]["added_p50_ms"] > TARGET_MS]
    for k in missed:
        print(f"MISSED: {k}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
