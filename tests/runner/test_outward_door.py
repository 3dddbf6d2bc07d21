"""``act`` through the door, in real sandboxes: a worker's outward call goes out through
the egress broker as its sandbox, once per key (a retry replays the recorded outcome,
a reused key is refused, a destination outside its grant is not sent); a cell SIGKILLed
between the send and the outcome leaves the next incarnation to record ``unknown``,
never re-sent (both backends; a loopback server counts what reaches it)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from charter.app import Charter
from charter.audit.semantic import audit_history
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control.outward import OutwardCalls, OutwardIntent, OutwardOutcome
from charter.core import Budget, KeyStore
from charter.runner.events import WorkerEnded, WorkerResult
from charter.sandbox.events import EgressOpened
from tests.runner._outward_server import CountingServer
from tests.runner._support import make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import PRELUDE, python
from tests.runner.test_crash import _cell

COST = Budget.parse("tokens=10k,wall=2m,cpu=2m,mem=256MiB,egress=1MB")
SLOT = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=256MiB,egress=1MB")  # room to send

ACTOR = (
    PRELUDE
    + """
base = sys.argv[1]
door = charter_door.Door()
def code(f):
    try:
        return f()
    except charter_door.DoorError as e:
        return [e.code, (e.data or {}).get("reason")]
out = {}
out["first"] = door.act("pay-1", base + "/pay", body="one")
out["retry"] = door.act("pay-1", base + "/pay", body="one")
out["other"] = door.act("pay-2", base + "/pay", body="two")
out["reused"] = code(lambda: door.act("pay-1", base + "/pay", body="changed"))
out["outside"] = door.act("far-1", "http://127.0.0.2:9/x", body="x")
out["bad"] = code(lambda: door.act("h-1", base + "/pay", headers={"Host": "evil"}))
door.result(json.dumps(out))
"""
)

# One call that the server holds until the test lets it go (the cell is killed first).
HELD = (
    PRELUDE
    + """
door = charter_door.Door()
door.result(json.dumps(door.act("held-1", sys.argv[1] + "/held", body="once")))
"""
)


def _spawn(charter: Charter, port: int, source: str, *args: str) -> str:
    intent = SpawnIntent.model_validate({
        "width": 1, "objective": "act outward once", "estimated_cost": COST,
        "grant": {"egress": [f"127.0.0.1:{port}"]},
    })  # fmt: skip
    result = charter.spawn(
        "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE),
        workers=(python(source, *args),),
    )  # fmt: skip
    return str(result.children[0].lineage)


@pytest.fixture
def server() -> CountingServer:
    s = CountingServer()
    yield s  # type: ignore[misc]
    s.close()


def _outward_findings(journal_entries_payloads: object) -> list[object]:
    report = audit_history(journal_entries_payloads)  # type: ignore[arg-type]
    return [f for f in report.findings if f.check == "outward-call"]


@pytest.mark.sandbox
def test_a_workers_outward_call_is_sent_once_per_key(
    journal_url: str, tmp_path: Path, state_dir: Path, server: CountingServer
) -> None:
    egress = frozenset({f"127.0.0.1:{server.port}"})
    with initialise(journal_url, tmp_path / "home", egress=egress) as charter:
        worker = _spawn(charter, server.port, ACTOR, f"http://127.0.0.1:{server.port}")
        with running(make_cell(charter, None, state_dir, door=True, budget=SLOT)) as cell:
            until_idle(cell)
        entries = list(charter.journal.entries())
        (answer,) = [e.event for e in entries if isinstance(e.event, WorkerResult)]
        out = json.loads(answer.text)
        assert out["first"]["status"] == "answered", out
        assert out["first"]["http_status"] == 201
        assert out["first"]["body"] == "created 1"
        assert out["first"]["replayed"] is False
        assert out["retry"]["replayed"] is True
        assert out["retry"]["body"] is None
        assert out["retry"]["reply_digest"] == out["first"]["reply_digest"]
        assert out["other"]["body"] == "created 2"  # positive control: a new key sends
        assert out["reused"] == [-32000, "outward-key-reused"]
        assert out["outside"]["status"] == "not-sent"  # not in its grant
        assert "destination not in the grant" in out["outside"]["detail"]
        assert out["bad"][0] == -32602
        assert server.sends("/pay") == 2  # pay-1 once, pay-2 once
        assert server.bodies == [b"one", b"two"]
        intents = [e.event for e in entries if isinstance(e.event, OutwardIntent)]
        outcomes = [e.event for e in entries if isinstance(e.event, OutwardOutcome)]
        assert sorted(i.key for i in intents) == ["far-1", "pay-1", "pay-2"]
        assert sorted(o.key for o in outcomes) == ["far-1", "pay-1", "pay-2"]
        assert {i.lineage for i in intents} == {worker}
        # It went out through the broker as the sandbox: each send's dial journaled.
        dials = [e.event for e in entries if isinstance(e.event, EgressOpened)]
        assert len([d for d in dials if d.destination == f"127.0.0.1:{server.port}"]) == 2
        positions = {type(e.event).__name__ + getattr(e.event, "key", ""): e.position
                     for e in entries}  # fmt: skip
        assert positions["OutwardIntentpay-1"] < positions["OutwardOutcomepay-1"]
        assert _outward_findings(charter.journal.payloads()) == []


@pytest.mark.sandbox
def test_a_cell_killed_after_the_send_leaves_unknown_never_re_sent(
    journal_url: str, tmp_path: Path, server: CountingServer
) -> None:
    home = tmp_path / "home"
    server.hold = True
    egress = frozenset({f"127.0.0.1:{server.port}"})
    with initialise(journal_url, home, egress=egress) as charter:
        worker = _spawn(charter, server.port, HELD, f"http://127.0.0.1:{server.port}")
    first = _cell(journal_url, home)
    try:
        assert server.arrived.wait(120), "the call reached the server"
        first.send_signal(signal.SIGKILL)  # after the send, before its outcome
        first.wait(30)
    finally:
        server.released.set()
    second = _cell(journal_url, home)
    _, err = second.communicate(timeout=180)
    assert second.returncode == 0, err
    with Charter.open(journal_url, keys=KeyStore(home)) as charter:
        entries = list(charter.journal.entries())
        outcomes = [e.event for e in entries if isinstance(e.event, OutwardOutcome)]
        assert [(o.key, o.status) for o in outcomes] == [("held-1", "unknown")]
        (end,) = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
        assert end.outcome == "lost"
        # The retry of that key, by whoever makes it, gets unknown and sends nothing.
        calls = OutwardCalls(charter.journal)
        intent = next(e.event for e in entries if isinstance(e.event, OutwardIntent))
        answer = calls.act(worker, "held-1", intent.digest, intent.destination, _never)
        assert answer.replayed
        assert answer.outcome.status == "unknown"
        assert server.sends("/held") == 1
        assert _outward_findings(charter.journal.payloads()) == []


def _never() -> object:
    raise AssertionError("a retry of a key with an intent must never send")


CREDENTIALED = (
    PRELUDE
    + """
door = charter_door.Door()
door.result(json.dumps(door.act("create-1", sys.argv[1], method="POST", body="{}")))
"""
)


@pytest.mark.sandbox
def test_an_outward_call_gets_its_held_credential_from_the_broker(
    tmp_path: Path, state_dir: Path
) -> None:
    """``act`` dials through the broker as the sandbox: to a destination a granted
    secret is bound to, the broker originates TLS and presents the token (which never
    enters the sandbox, nor the journal); the request's digest is of what the worker
    asked, without the token."""
    from tests.sandbox._creds_support import token_estate

    token = "outward-token-0123456789abcdef"
    root = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=4GiB,egress=1GB")
    charter, tls_server, where = token_estate(tmp_path, token, root)
    try:
        with charter:
            intent = SpawnIntent.model_validate({
                "width": 1, "objective": "create the record once", "estimated_cost": COST,
                "grant": {"egress": where, "secrets": ["tok"]},
            })  # fmt: skip
            charter.spawn(
                "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE),
                workers=(python(CREDENTIALED, f"http://{where[0]}/"),),
            )  # fmt: skip
            with running(make_cell(charter, None, state_dir, door=True, budget=SLOT)) as cell:
                until_idle(cell)
            entries = list(charter.journal.entries())
    finally:
        tls_server.close()
    (answer,) = [e.event for e in entries if isinstance(e.event, WorkerResult)]
    out = json.loads(answer.text)
    assert out["status"] == "answered", out
    assert out["http_status"] == 200
    assert out["body"].startswith("ok with-authorization")
    assert [s.headers["authorization"] for s in tls_server.seen] == [f"Bearer {token}"]
    injected = [e.event for e in entries if type(e.event).__name__ == "CredentialInjected"]
    assert len(injected) == 1
    assert all(token not in json.dumps(e.event.payload()) for e in entries)
