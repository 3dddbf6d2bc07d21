"""The model door (docs/model-door.md): real sandboxes call an OpenAI-compatible server of
the tests' own on loopback through ``/run/charter/model.sock``; every call is reserved
against the worker's lease before it is sent and settled once after, exactly from the
server's usage or as a flagged estimate."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from charter.app import Charter
from charter.audit.semantic import audit_history
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import LeaseReleased, UsageRecorded
from charter.control import SpawnResult, WorkerSpec
from charter.core import Budget
from charter.runner.cell import Cell
from charter.runner.door import Door
from charter.runner.events import (
    ModelCallRefused,
    ModelCallSettled,
    WorkerEnded,
    WorkerResult,
)
from charter.runner.model import ModelEndpoint, configure_endpoint, load_endpoint
from charter.supervision.events import QuarantineVerdict
from charter.supervision.honeytokens import CREDENTIAL_DIR
from tests.invariants import (
    check_history,
    check_journal_allowance,
    check_model_calls,
    check_settled,
    check_workers,
    journal_history,
)
from tests.runner._model_server import Behaviour, model_server
from tests.runner._support import running, until_idle
from tests.runner.conftest import SLOT_BUDGET, initialise, steady
from tests.runner.programs import PRELUDE, python

API_KEY = "sk-charter-test-0123456789"

# Makes the model calls argv[1] names ([{"stream", "max_tokens", "content",
# "include_usage"}]) one after another, and answers with what each returned.
CALLER = (
    PRELUDE
    + """
import os
calls = json.loads(sys.argv[1])
out = []
for c in calls:
    conn = charter_door.ModelConnection(timeout=60)
    body = {"model": "test-model", "messages": [{"role": "user", "content": c["content"]}],
            "stream": c.get("stream", False)}
    if c.get("max_tokens"):
        body["max_tokens"] = c["max_tokens"]
    if c.get("include_usage"):
        body["stream_options"] = {"include_usage": True}
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read().decode()
    one = {"status": r.status}
    if c.get("stream") and r.status == 200:
        events = [e[6:] for e in data.split("\\n\\n") if e.startswith("data: ")]
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
        one["content"] = sum(1 for ch in chunks for x in ch.get("choices", [])
                             if x.get("delta", {}).get("content"))
        one["usage"] = [ch["usage"] for ch in chunks if ch.get("usage")]
        one["cut"] = [ch["error"]["code"] for ch in chunks if "error" in ch]
        one["done"] = events[-1:] == ["[DONE]"]
    else:
        loaded = json.loads(data)
        one["usage"] = loaded.get("usage")
        one["code"] = (loaded.get("error") or {}).get("code")
    out.append(one)
    conn.close()
env = " ".join(f"{k}={v}" for k, v in os.environ.items())
files = ""
for root, dirs, names in os.walk("/workspace"):
    # Not the decoy credential Charter plants (docs/door.md: nothing there is the
    # worker's to read): reading it is a canary touch, and the worker is quarantined.
    dirs[:] = [d for d in dirs if d != CREDENTIAL_DIR]
    for n in names:
        with open(os.path.join(root, n), "rb") as f:
            files += f.read().decode("latin-1")
out.append({"key_seen": API_KEY in env or API_KEY in files})
charter_door.Door().result(json.dumps(out))
""".replace("API_KEY", repr(API_KEY)).replace("CREDENTIAL_DIR", repr(CREDENTIAL_DIR))
)


def spawn_callers(charter: Charter, tokens: int, *workers: WorkerSpec) -> SpawnResult:
    cost = Budget.parse(f"tokens={tokens},wall=10m,cpu=10m,mem=1GiB,egress=0MB")
    intent = SpawnIntent.model_validate(
        {"width": len(workers), "objective": "call the model", "estimated_cost": cost}
    )
    return charter.spawn(
        "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=tuple(workers)
    )


def spawning_caller(charter: Charter, tokens: int) -> tuple[str, Callable[[int], None]]:
    """One worker under a lease of ``tokens`` that may fan out (4 wide, 2 deep): its
    lineage, and a spawn below it of one child carving the tokens it is given (a
    refusal raises)."""
    cost = Budget.parse(f"tokens={tokens},wall=10m,cpu=10m,mem=1GiB,egress=0MB")
    top = SpawnIntent.model_validate(
        {"width": 1, "objective": "a caller that spawns", "estimated_cost": cost,
         "grant": {"fanout": 4, "depth": 2}}
    )  # fmt: skip
    (parent,) = charter.spawn(
        "agent:estate", top, policy=FixedPolicy(Verdict.POSITIVE), workers=(python(""),)
    ).children
    below = charter.spawn_service().durable_caller("estate").child(parent)

    def spawn(carved: int) -> None:
        carve = SpawnIntent(
            width=1, objective="takes what the book shows",
            estimated_cost=Budget.parse(f"tokens={carved},wall=1m,cpu=1m,mem=64MiB,egress=0"),
        )  # fmt: skip
        charter.spawn(below, carve, policy=FixedPolicy(Verdict.POSITIVE))

    return str(parent.lineage), spawn


def one_caller(charter: Charter, tokens: int, source: str, *args: str) -> str:
    """One worker running ``source`` under a lease of ``tokens``: its lineage."""
    (child,) = spawn_callers(charter, tokens, python(source, *args)).children
    return str(child.lineage)


def run_to_idle(charter: Charter, state_dir: Path, endpoint: ModelEndpoint | None) -> None:
    with running(model_cell(charter, state_dir, endpoint)) as cell:
        until_idle(cell)


def model_cell(charter: Charter, state_dir: Path, endpoint: ModelEndpoint | None) -> Cell:
    tag = uuid.uuid4().hex[:8]
    door = Door(
        state_dir / f"door-test-{tag}.sock",
        model_path=state_dir / f"model-test-{tag}.sock",
        endpoint=endpoint,
    )
    charter.host_load = steady
    cell = Cell(
        charter, cell=charter.settings.cell, budget=SLOT_BUDGET, state_dir=state_dir,
        key_broker=door,
    )  # fmt: skip
    door.cell = cell
    return cell


def results(charter: Charter) -> dict[str, object]:
    return {
        e.event.lineage: json.loads(e.event.text)
        for e in charter.journal.entries()
        if isinstance(e.event, WorkerResult)
    }


def of_type(charter: Charter, kind: type) -> list:
    return [e.event for e in charter.journal.entries() if isinstance(e.event, kind)]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


def clean(charter: Charter) -> None:
    history = journal_history(charter.journal)
    for check in (check_history, check_workers, check_settled, check_journal_allowance):
        assert check(history).problems == [], check.__name__
    assert check_model_calls(history).problems == []
    assert not of_type(charter, QuarantineVerdict)  # no worker here touched a canary
    report = audit_history(charter.journal.payloads(None, None))  # `charter audit`'s rules
    assert report.findings == ()  # nothing found, model calls or otherwise


def test_tokens_charged_are_the_servers_usage_streamed_and_not(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    calls = [
        {"content": "one two three", "max_tokens": 5},
        {"content": "four five", "stream": True, "include_usage": True, "max_tokens": 6},
        {"content": "six", "stream": True},  # no usage asked for: settled exactly all the same
    ]
    with (
        model_server(Behaviour(length=7)) as (url, server),
        initialise(journal_url, tmp_path / "home") as charter,
    ):
        configure_endpoint(tmp_path / "home", url, _key_file(tmp_path))
        endpoint = load_endpoint(tmp_path / "home")
        worker = one_caller(charter, 10_000, CALLER, json.dumps(calls))
        run_to_idle(charter, state_dir, endpoint)
        out = results(charter)[worker]
        assert [o["status"] for o in out[:3]] == [200, 200, 200]
        assert out[0]["usage"] == {"prompt_tokens": 6, "completion_tokens": 5, "total_tokens": 11}
        assert out[1]["content"] == 6
        assert out[1]["done"]
        assert len(out[1]["usage"]) == 1
        assert out[2]["content"] == 7
        assert out[2]["usage"] == []
        assert out[3] == {"key_seen": False}  # the key is held by Charter, never inside
        assert server.auth == [f"Bearer {API_KEY}"] * 3
        # Each call's max_tokens was forwarded as reserved; streams were asked for usage.
        assert [s["max_tokens"] for s in server.seen] == [5, 6, 1024]
        assert all(s["stream_options"]["include_usage"] for s in server.seen[1:])
        reserved = of_type(charter, ModelCallSettled)
        # In the calls' order (a call settles after its answer is relayed, so the next
        # one, on another connection, may settle first).
        by_call = {s.call: s for s in of_type(charter, ModelCallSettled)}
        settled = [by_call[r.call] for r in reserved]
        assert [(s.prompt_tokens, s.completion_tokens) for s in settled] == server.reported
        assert all(not s.estimated and s.how == "usage" for s in settled)
        assert all(s.first_token_ms is not None for s in settled[1:])
        assert [r.model for r in reserved] == ["test-model"] * 3
        assert [r.stream_response for r in reserved] == [False, True, True]
        tokens = sum(
            u.amount.tokens for u in of_type(charter, UsageRecorded) if u.lineage == worker
        )
        assert tokens == sum(p + c for p, c in server.reported)
        # What `charter budgets` shows: the lease's spent tokens.
        with charter.projector() as projector:
            projector.catch_up()
            assert projector.budgets().get(worker).spent.tokens == tokens
            (node,) = [n for n in projector.tree().nodes if n.lineage == worker]  # `charter tree`
        assert node.tokens_spent == tokens
        clean(charter)


def _key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-key"
    path.write_text(API_KEY + "\n")
    return path


def test_a_spent_lease_is_refused_and_a_stream_is_cut_at_the_cap(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    spend = [{"content": "a b c", "max_tokens": 50}] * 3  # the lease is spent by the operator
    cut = [{"content": "x", "stream": True, "include_usage": True, "max_tokens": 5}]
    with (
        model_server(Behaviour(length=40, ignore_max_tokens=True)) as (url, server),
        initialise(journal_url, tmp_path / "home") as charter,
    ):
        spawned = spawn_callers(
            charter, 1000, python(CALLER, json.dumps(spend)), python(CALLER, json.dumps(cut))
        )
        spent, cutter = (str(c.lineage) for c in spawned.children)
        whole = Budget(tokens=1000, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)
        charter.budgets().record_usage(spent, whole)  # its tokens are gone before it runs
        with running(model_cell(charter, state_dir, ModelEndpoint(url, API_KEY))) as cell:
            until_idle(cell)
        out = results(charter)
        ends = {e.lineage: (e.outcome, e.reason) for e in of_type(charter, WorkerEnded)}
        assert spent in out, ends  # how it ended instead, when it gave no result
        assert [(o["status"], o["code"]) for o in out[spent][:3]] == [(429, "model-tokens")] * 3
        refused = of_type(charter, ModelCallRefused)
        assert [(r.lineage, r.reason, r.left) for r in refused] == [(spent, "model-tokens", 0)]
        assert not [r for r in of_type(charter, ModelCallSettled) if r.lineage == spent]
        # The server streamed 40 tokens whatever it was told; the door relayed 5.
        (streamed,) = out[cutter][:1]
        assert streamed["content"] == 5
        assert streamed["cut"] == ["model-tokens"]
        assert not streamed["done"]
        (settled,) = of_type(charter, ModelCallSettled)
        assert (settled.how, settled.estimated, settled.completion_tokens) == (
            "cut-at-cap", True, 5,
        )  # fmt: skip
        (reserved,) = of_type(charter, ModelCallSettled)
        assert settled.prompt_tokens == reserved.prompt_estimate
        assert len(server.seen) == 1
        clean(charter)


# The Responses shape: the calls argv[1] names ([{"input", "stream",
# "max_output_tokens"}]), one connection each; answers what each returned.
RESPONDER = (
    PRELUDE
    + """
out = []
for c in json.loads(sys.argv[1]):
    conn = charter_door.ModelConnection(timeout=60)
    body = {"model": "test-model", "input": c["input"], "stream": c.get("stream", False),
            "max_output_tokens": c["max_output_tokens"]}
    conn.request("POST", "/v1/responses", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read().decode()
    one = {"status": r.status}
    if c.get("stream"):
        events = [json.loads(line[6:]) for line in data.split("\\n") if line.startswith("data: ")]
        one["deltas"] = sum(1 for e in events if e.get("type") == "response.output_text.delta")
        one["usage"] = [e["response"]["usage"] for e in events
                        if e.get("type") == "response.completed"]
        one["cut"] = [e["code"] for e in events if e.get("type") == "error"]
    else:
        one["usage"] = [json.loads(data)["usage"]]
    out.append(one)
    conn.close()
charter_door.Door().result(json.dumps(out))
"""
)


def test_the_responses_shape_is_charged_the_servers_usage_streamed_and_not(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    calls = [
        {"input": "one two three", "max_output_tokens": 5},
        {"input": [{"role": "user", "content": "four five"}], "stream": True,
         "max_output_tokens": 6},
    ]  # fmt: skip
    with (
        model_server(Behaviour(length=7)) as (url, server),
        initialise(journal_url, tmp_path / "home") as charter,
    ):
        worker = one_caller(charter, 10_000, RESPONDER, json.dumps(calls))
        run_to_idle(charter, state_dir, ModelEndpoint(url, API_KEY))
        out = results(charter)[worker]
        assert [o["status"] for o in out] == [200, 200]
        assert out[0]["usage"][0]["input_tokens"] == 6  # the server's count, not the estimate
        assert (out[1]["deltas"], out[1]["cut"]) == (6, [])
        assert [(u["input_tokens"], u["output_tokens"]) for u in out[1]["usage"]] == [(5, 6)]
        assert [s["max_output_tokens"] for s in server.seen] == [5, 6]
        assert "stream_options" not in server.seen[1]  # a Responses stream reports usage
        by_call = {s.call: s for s in of_type(charter, ModelCallSettled)}
        settled = [by_call[r.call] for r in of_type(charter, ModelCallSettled)]
        assert [(s.prompt_tokens, s.completion_tokens) for s in settled] == server.reported
        assert all(s.how == "usage" and not s.estimated for s in settled)
        tokens = sum(
            u.amount.tokens for u in of_type(charter, UsageRecorded) if u.lineage == worker
        )
        assert tokens == sum(p + c for p, c in server.reported) == 6 + 5 + 5 + 6
        clean(charter)


def test_a_responses_stream_is_cut_at_the_cap(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    cut = [{"input": "x", "stream": True, "max_output_tokens": 3}]
    with (
        model_server(Behaviour(length=40, ignore_max_tokens=True)) as (url, _),
        initialise(journal_url, tmp_path / "home") as charter,
    ):
        cutter = one_caller(charter, 10_000, RESPONDER, json.dumps(cut))
        run_to_idle(charter, state_dir, ModelEndpoint(url, API_KEY))
        (streamed,) = results(charter)[cutter]
        assert (streamed["deltas"], streamed["cut"], streamed["usage"]) == (3, ["model-tokens"], [])
        (settled,) = of_type(charter, ModelCallSettled)
        (reserved,) = of_type(charter, ModelCallSettled)
        assert (settled.how, settled.estimated) == ("cut-at-cap", True)
        assert (settled.prompt_tokens, settled.completion_tokens) == (reserved.prompt_estimate, 3)
        clean(charter)


def test_an_unconfigured_door_refuses_and_a_malformed_call_is_bad_input(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    calls = [{"content": "hello"}, {"content": "again"}]
    with initialise(journal_url, tmp_path / "home") as charter:
        worker = one_caller(charter, 10_000, CALLER, json.dumps(calls))
        run_to_idle(charter, state_dir, None)
        out = results(charter)[worker]
        assert [(o["status"], o["code"]) for o in out[:2]] == [(503, "model-not-configured")] * 2
        refused = of_type(charter, ModelCallRefused)
        assert [r.reason for r in refused] == ["model-not-configured"]  # journaled once
        clean(charter)


# 16 threads, each on its own connection, start a held stream at once.
CONCURRENT = (
    PRELUDE
    + """
import threading
n = int(sys.argv[1])
barrier = threading.Barrier(n)
statuses = [None] * n
def call(i):
    conn = charter_door.ModelConnection(timeout=120)
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True,
            "max_tokens": 20}
    barrier.wait()
    conn.request("POST", "/v1/chat/completions", json.dumps(body))
    r = conn.getresponse()
    r.read()
    statuses[i] = r.status
threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
charter_door.Door().result(json.dumps(statuses))
"""
)


def test_sixteen_concurrent_calls_on_one_lease_never_overspend_it(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    hold = threading.Event()
    with (
        model_server(Behaviour(length=20, hold=hold, hold_after=1)) as (url, server),
        initialise(journal_url, tmp_path / "home") as charter,
    ):
        # Each call reserves its estimate (the body's bytes / 4, rounded up) + 20: the
        # lease holds room for 6 of them at once, not 16.
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True,
             "max_tokens": 20}
        ).encode()  # fmt: skip
        per_call = -(-len(body) // 4) + 20
        tokens = 6 * per_call + per_call // 2
        worker = one_caller(charter, tokens, CONCURRENT, "16")
        try:
            with running(model_cell(charter, state_dir, ModelEndpoint(url))) as cell:
                wait_for(lambda: len(server.seen) >= 6, "six calls reached the server")
                wait_for(lambda: bool(of_type(charter, ModelCallRefused)), "a refusal")
                hold.set()
                until_idle(cell)
        finally:
            hold.set()
        (statuses,) = (results(charter)[worker],)
        admitted = statuses.count(200)
        assert statuses.count(429) >= 1
        assert admitted >= 6
        assert admitted + statuses.count(429) == 16
        reserved = of_type(charter, ModelCallSettled)
        assert len(reserved) == admitted
        usage = [u for u in of_type(charter, UsageRecorded) if u.lineage == worker]
        assert sum(u.amount.tokens for u in usage) <= tokens
        assert all(u.refused.tokens == 0 for u in usage)
        settled = of_type(charter, ModelCallSettled)
        assert len(settled) == admitted
        assert all(s.how == "usage" for s in settled)
        clean(charter)  # no reservation ever held more than the lease had left


# A call on a connection it keeps open, then a streamed call on a second one (the
# server holds it after one token); then both close.
KEPT_OPEN = (
    PRELUDE
    + """
def call(conn, content, stream):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}],
                       "max_tokens": 4, "stream": stream})
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    return r.status
first = charter_door.ModelConnection(timeout=120)
one = call(first, "one", False)
second = charter_door.ModelConnection(timeout=120)
two = call(second, "two", True)
first.close()
second.close()
charter_door.Door().result(json.dumps([one, two]))
"""
)


def test_an_answered_calls_settlement_is_journaled_while_its_connection_idles(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # The first call's settlement waits for its connection's next reservation to carry
    # it; none comes, so it is journaled on its own: while that connection is still
    # open (the worker closes it only after the held second call ends).
    hold = threading.Event()
    with (
        model_server(Behaviour(length=4, hold=hold, hold_after=1)) as (url, server),
        initialise(journal_url, tmp_path / "home") as charter,
    ):
        worker = one_caller(charter, 10_000, KEPT_OPEN)
        try:
            with running(model_cell(charter, state_dir, ModelEndpoint(url))) as cell:
                wait_for(lambda: len(server.seen) == 2, "the second call reached the server")
                wait_for(lambda: bool(of_type(charter, ModelCallSettled)), "a settlement")
                (first,) = of_type(charter, ModelCallSettled)
                assert not hold.is_set()  # the second call is still held: both are open
                hold.set()
                until_idle(cell)
        finally:
            hold.set()
        assert results(charter)[worker] == [200, 200]
        reserved = of_type(charter, ModelCallSettled)
        assert first.call == reserved[0].call
        assert (first.how, first.estimated) == ("usage", False)
        assert (first.prompt_tokens, first.completion_tokens) == server.reported[0]
        assert len(of_type(charter, ModelCallSettled)) == 2
        clean(charter)


# Reads the first argv[1] content chunks of a stream, then hangs up and exits.
DISCONNECT = (
    PRELUDE
    + """
import socket
n = int(sys.argv[1])
s = socket.socket(socket.AF_UNIX)
s.connect(charter_door.MODEL_PATH)
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "go on"}],
                   "stream": True, "stream_options": {"include_usage": True},
                   "max_tokens": 30}).encode()
s.sendall(b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: charter\\r\\n"
          b"Content-Type: application/json\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body)
seen = b""
while seen.count(b'"content"') < n:
    got = s.recv(65536)
    if not got:
        break
    seen += got
charter_door.Door().result(str(seen.count(b'"content"')))
s.close()
"""
)


def test_a_disconnect_mid_stream_still_settles_an_estimate_before_the_lease_returns(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    hold = threading.Event()
    with (
        model_server(Behaviour(length=30, hold=hold, hold_after=3)) as (url, server),
        initialise(journal_url, tmp_path / "home") as charter,
    ):
        worker = one_caller(charter, 10_000, DISCONNECT, "3")
        try:
            with running(model_cell(charter, state_dir, ModelEndpoint(url))) as cell:
                until_idle(cell)
        finally:
            hold.set()
        assert results(charter)[worker] == 3
        entries = list(charter.journal.entries())
        (settled,) = [
            (e.position, e.event) for e in entries if isinstance(e.event, ModelCallSettled)
        ]
        (reserved,) = of_type(charter, ModelCallSettled)
        position, event = settled
        assert (event.how, event.estimated) == ("client-gone", True)
        assert event.completion_tokens == 3
        assert event.prompt_tokens == reserved.prompt_estimate
        charge = entries[[e.position for e in entries].index(position) - 1].event
        assert isinstance(charge, UsageRecorded)
        assert charge.amount.tokens == 3 + reserved.prompt_estimate
        (released,) = [
            e.position
            for e in entries
            if isinstance(e.event, LeaseReleased) and e.event.lineage == worker
        ]
        assert position < released  # settled before its lease returned: never lost
        assert server.reported == []  # the server never reported usage
        clean(charter)


# Calls until refused; reports on stderr (its result would be refused too: the floor is
# spent) how many calls were answered and the first refusal's code.
FLOOD = (
    PRELUDE
    + """
conn = charter_door.ModelConnection(timeout=60)
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                   "max_tokens": 1})
ok, code = 0, None
for _ in range(int(sys.argv[1])):
    conn.request("POST", "/v1/chat/completions", body)
    r = conn.getresponse()
    answer = json.loads(r.read())
    if r.status != 200:
        code = [r.status, answer["error"]["code"]]
        break
    ok += 1
sys.stderr.write(json.dumps({"ok": ok, "code": code}))
sys.exit(3)
"""
)


def test_model_calls_are_charged_to_the_journal_allowance(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with (
        model_server(Behaviour(length=1)) as (url, _server),
        initialise(journal_url, tmp_path / "home") as charter,
    ):
        worker = one_caller(charter, 10**6, FLOOD, "400")
        run_to_idle(charter, state_dir, ModelEndpoint(url))
        (end,) = [e for e in of_type(charter, WorkerEnded) if e.lineage == worker]
        said = json.loads(end.reason.removeprefix("stderr: "))
        # Each call journals three entries (about 1.5 KB charged); the lease has no
        # egress, so its 128 KiB floor pays for some 80 calls, and then they are refused.
        assert said["code"] == [429, "journal-allowance"]
        assert 60 <= said["ok"] <= 100, said
        assert len(of_type(charter, ModelCallSettled)) == said["ok"]
        clean(charter)
