"""Programs and set-up for the delegation tests (docs/delegation.md): an estate whose
workers may reach one loopback server, and own-sandbox agents with destinations and a
held secret of their own."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from charter.app import Charter
from charter.control import Ceiling
from charter.core import Budget
from charter.ledger import Journal
from tests.invariants import (
    check_delegations,
    check_history,
    check_settled,
    check_workers,
    journal_history,
)
from tests.runner._support import fan_out
from tests.runner.programs import PRELUDE, PY, python

COST = Budget.parse("tokens=50k,wall=3m,cpu=3m,mem=512MiB,egress=1MB")
AGENT_CEILING = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=100MB")
SLOT = Budget.parse("tokens=0,wall=120s,cpu=60s,mem=256MiB,egress=1MB")
DELEGATE_BUDGET = Budget.parse("tokens=10k,wall=90s,cpu=30s,mem=128MiB,egress=200KB")
# More than any caller's lease holds (its memory): reserving it is refused.
GREEDY_BUDGET = Budget.parse("tokens=10k,wall=90s,cpu=30s,mem=4GiB,egress=200KB")

# Over the egress broker's socket, plain HTTP in absolute form (so the broker can
# present a held credential, originating TLS itself): (status line, body) or the
# error that ended it.
GET = r"""
import os, socket
def get(url):
    host = url.split("/")[2]
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(os.environ["CHARTER_EGRESS_SOCKET"])
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    except OSError as e:
        return [type(e).__name__, ""]
    head, _, body = data.partition(b"\r\n\r\n")
    return [head.split(b"\r\n")[0].decode("latin-1"), body.decode("latin-1")]
def code(f):
    try:
        f()
        return "ok"
    except charter_door.DoorError as e:
        return [e.code, (e.data or {}).get("reason")]
"""

# The own-sandbox agent: its own destination (argv[1], with its held token presented
# by the broker), the caller's (argv[2], handed over as its input), a nested delegation
# and a spawn; its environment, to be searched for the token.
FETCHER = (
    PRELUDE
    + GET
    + r"""
door = charter_door.Door()
own, theirs = get(sys.argv[1]), get(sys.argv[2])
intent = {"width": 1, "objective": "nested", "estimated_cost": {"tokens": 1, "wall_ms": 1000,
          "cpu_ms": 1000, "mem_bytes": 1048576, "egress_bytes": 0}}
nested = code(lambda: door.delegate("fetcher", [sys.argv[1], sys.argv[2]]))
spawned = code(lambda: door.spawn(intent, [{"argv": ["/bin/true"]}]))
# (Its workspace files are not read: the cell plants decoys there, and reading one is
# a canary touch that gets it killed, docs/supervision.md.)
environ = open("/proc/self/environ", "rb").read().decode("latin-1")
door.result(json.dumps({"own": own, "theirs": theirs, "nested": nested, "spawned": spawned,
                        "env": dict(os.environ), "environ": environ}))
"""
)

# The caller: a refused delegation (too little left), the delegation, then its own
# destination (argv[1]) and the delegate's (argv[2]) through its own egress.
CALLER = (
    PRELUDE
    + GET
    + r"""
door = charter_door.Door()
out = {"greedy": code(lambda: door.delegate("greedy", [sys.argv[1]])),
       "unknown": code(lambda: door.delegate("nobody", [])),
       "reply": door.delegate("fetcher", [sys.argv[1]], timeout_s=240),
       "mine": get(sys.argv[1]), "theirs": get(sys.argv[2])}
door.result(json.dumps(out))
"""
)

# An own-sandbox agent that says it started (a GET of argv[1]) and then runs on.
SLEEPER = (
    PRELUDE
    + GET
    + r"""
import time
get(sys.argv[1] + "/started")
time.sleep(600)
"""
)

# A caller that delegates to the sleeper and waits (it is killed, or its cell is).
WAITER = (
    PRELUDE
    + """
door = charter_door.Door()
door.result(json.dumps(door.delegate("sleeper", [sys.argv[1]], timeout_s=600)))
"""
)

# A caller that sends its delegation, closes the connection once the delegate has
# started (argv[1] + /state says so), and lives on until the delegate has gone (then
# answers): it stopped waiting, it did not end.
HANGER = (
    PRELUDE
    + GET
    + r"""
import socket, time
s = socket.socket(socket.AF_UNIX)
s.connect(charter_door.DEFAULT_PATH)
req = {"jsonrpc": "2.0", "id": 1, "method": "delegate",
       "params": {"agent": "sleeper", "inputs": [sys.argv[1]], "timeout_s": 600}}
s.sendall(json.dumps(req).encode() + b"\n")
while get(sys.argv[1] + "/state")[1] != "started":
    time.sleep(0.05)
s.close()
while get(sys.argv[1] + "/state")[1] != "gone":
    time.sleep(0.05)
charter_door.Door().result("closed")
"""
)


class FlagServer:
    """Plain HTTP on loopback: ``GET /started`` marks the delegate started, ``GET
    /state`` answers ``waiting``, ``started`` or ``gone`` (set by the test)."""

    def __init__(self) -> None:
        self.state = "waiting"
        self.started = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.endswith("/started"):
                    outer.state = "started"
                    outer.started.set()
                body = outer.state.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def own_agent(
    charter: Charter,
    name: str,
    source: str,
    *args: str,
    egress: frozenset[str] = frozenset(),
    secrets: frozenset[str] = frozenset(),
    budget: Budget = DELEGATE_BUDGET,
) -> None:
    spec = python(source, *args)
    ceiling = Ceiling(budget=AGENT_CEILING, depth=1, fanout=10, egress=egress, secrets=secrets)
    charter.add_agent(name, ceiling, own_sandbox=(*spec.argv, *spec.inputs), delegate_budget=budget)


def spawn_caller(charter: Charter, source: str, *args: str, egress: list[str]) -> str:
    spec = python(source, *args)
    result = fan_out(charter, 1, spec, cost=COST, egress=egress, depth=1, fanout=2)
    return str(result.children[0].lineage)


def folds_clean(journal: Journal) -> None:
    """The independent fold (tests/invariants.py) over the whole journal."""
    history = journal_history(journal)
    assert check_history(history).problems == []
    assert check_workers(history).problems == []
    assert check_settled(history).problems == []
    delegations = check_delegations(history)
    assert delegations.problems == []
    assert delegations.checked == len(history)


__all__ = [
    "CALLER", "COST", "DELEGATE_BUDGET", "FETCHER", "FlagServer", "GREEDY_BUDGET",
    "HANGER", "PY", "Path", "SLEEPER", "SLOT", "WAITER", "folds_clean", "own_agent",
    "spawn_caller",
]  # fmt: skip
