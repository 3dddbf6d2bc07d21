"""Outward-acting calls are sent at most once per key: the journal part, on both
backends, with a real process SIGKILLed at each point of a call and a real loopback
server counting what reaches it (docs/door.md, ``act``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from charter.audit.semantic import audit_history
from charter.control.outward import (
    OutwardAnswer,
    OutwardCalls,
    OutwardIntent,
    OutwardKeyReusedError,
    OutwardNotSent,
    OutwardOutcome,
    OutwardPendingError,
    OutwardReply,
)
from charter.ledger import Journal
from tests.runner._outward_client import digest_of, post
from tests.runner._outward_server import CountingServer

ROOT = Path(__file__).resolve().parents[2]
LINEAGE = "agent:estate/sa-1"


@pytest.fixture
def server() -> CountingServer:
    s = CountingServer()
    yield s  # type: ignore[misc]
    s.close()


def _crash_at(
    journal_url: str, key: str, target: str, point: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.runner._outward_proc", journal_url, LINEAGE, key, target,
         point],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def _act(
    calls: OutwardCalls, target: str, key: str, *, lineage: str = LINEAGE, asked: str = ""
) -> OutwardAnswer:
    """The call a test makes: POST ``key`` to ``target`` (``asked``: the request's
    digest is of another body, a key reused for another request)."""
    digest = digest_of(target, asked or key)
    return calls.act(lineage, key, digest, "127.0.0.1", lambda: post(target, key))


def _events(journal: Journal, key: str) -> list[object]:
    return [
        e.event
        for e in journal.entries(types=("OutwardIntent", "OutwardOutcome"))
        if getattr(e.event, "key", None) == key
    ]


@pytest.mark.parametrize(
    ("point", "sent_by_first", "status", "replayed"),
    [
        ("before-intent", 0, "answered", False),  # nothing journaled: the retry sends
        ("after-intent", 0, "unknown", True),  # intent, not sent: never sent
        ("after-send", 1, "unknown", True),  # intent and send, no outcome: never re-sent
        ("after-outcome", 1, "answered", True),  # the recorded outcome
    ],
)
def test_a_call_retried_after_a_crash_at_each_point_is_sent_at_most_once(
    journal_url: str, server: CountingServer, point: str, sent_by_first: int, status: str,
    replayed: bool,
) -> None:  # fmt: skip
    Journal.create(journal_url).close()
    key = f"charge-{point}"
    target = f"http://127.0.0.1:{server.port}/{key}"
    done = _crash_at(journal_url, key, target, point)
    assert done.returncode == -9, done.stderr  # a real SIGKILL, at that point
    assert server.sends(f"/{key}") == sent_by_first
    with Journal.open(journal_url) as journal:  # the restarted process
        calls = OutwardCalls(journal)
        answer = _act(calls, target, key)
        assert answer.outcome.status == status
        assert answer.replayed is replayed
        if point == "after-outcome":
            assert answer.outcome.http_status == 201
            assert answer.outcome.reply_bytes == len(b"created 1")
        assert server.sends(f"/{key}") <= 1  # at most once, whatever the crash
        assert server.sends(f"/{key}") == (1 if point != "after-intent" else 0)
        # A second retry gets the same record and sends nothing either.
        again = _act(calls, target, key)
        assert again.replayed
        assert again.outcome == answer.outcome
        assert server.sends(f"/{key}") == (1 if point != "after-intent" else 0)
        events = _events(journal, key)
        assert [type(e).__name__ for e in events] == ["OutwardIntent", "OutwardOutcome"]
        report = audit_history(journal.payloads())
        assert report.ok, report.findings


def test_the_first_call_answers_and_a_retry_replays_it(
    journal_url: str, server: CountingServer
) -> None:
    with Journal.create(journal_url) as journal:
        calls = OutwardCalls(journal)
        target = f"http://127.0.0.1:{server.port}/once"
        first = _act(calls, target, "k1")
        assert (first.outcome.status, first.replayed, first.body) == (
            "answered",
            False,
            b"created 1",
        )
        retry = _act(calls, target, "k1")
        assert retry.replayed
        assert retry.body is None
        assert retry.outcome == first.outcome
        assert server.sends("/once") == 1
        # Positive control: another key is another call, sent.
        other = _act(calls, target, "k2")
        assert not other.replayed
        assert server.sends("/once") == 2
        # The same key of another lease is its own key.
        _act(calls, target, "k1", lineage="agent:estate/sa-2")
        assert server.sends("/once") == 3


def test_a_key_used_for_another_request_is_refused_and_nothing_is_sent(
    journal_url: str, server: CountingServer
) -> None:
    with Journal.create(journal_url) as journal:
        calls = OutwardCalls(journal)
        target = f"http://127.0.0.1:{server.port}/reuse"
        _act(calls, target, "k")
        with pytest.raises(OutwardKeyReusedError):
            _act(calls, target, "k", asked="other")
        assert server.sends("/reuse") == 1
        assert len(_events(journal, "k")) == 2  # no second intent


def test_a_retry_while_the_first_is_sending_is_pending_then_replayed(
    journal_url: str, server: CountingServer
) -> None:
    server.hold = True
    with Journal.create(journal_url) as journal:
        calls = OutwardCalls(journal)
        target = f"http://127.0.0.1:{server.port}/slow"
        answers: list[object] = []
        first = threading.Thread(target=lambda: answers.append(
            _act(calls, target, "k")
        ))  # fmt: skip
        first.start()
        assert server.arrived.wait(30)
        with pytest.raises(OutwardPendingError):
            _act(calls, target, "k")
        server.released.set()
        first.join(30)
        retry = _act(calls, target, "k")
        assert retry.replayed
        assert retry.outcome.status == "answered"
        assert server.sends("/slow") == 1


@pytest.mark.parametrize("shared", [True, False], ids=["one-process", "many-processes"])
def test_racing_tries_of_one_key_send_once(
    journal_url: str, server: CountingServer, shared: bool
) -> None:
    """Eight tries at once: through one process's calls (the in-flight set), or each
    through its own (as separate processes would: only the journal's pin decides)."""
    Journal.create(journal_url).close()
    target = f"http://127.0.0.1:{server.port}/race"
    journals = [Journal.open(journal_url) for _ in range(8)]
    one = OutwardCalls(journals[0])
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def go(journal: Journal) -> None:
        calls = one if shared else OutwardCalls(journal)
        barrier.wait()
        try:
            answer = _act(calls, target, "k")  # fmt: skip
            outcomes.append(answer.outcome.status)
        except OutwardPendingError:
            outcomes.append("pending")

    threads = [threading.Thread(target=go, args=(j,)) for j in journals]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == 8
    assert server.sends("/race") == 1  # the attack: eight tries, one send
    intents = [e for e in _events(journals[0], "k") if isinstance(e, OutwardIntent)]
    outcome = [e for e in _events(journals[0], "k") if isinstance(e, OutwardOutcome)]
    assert len(intents) == 1
    assert len(outcome) == 1
    for j in journals:
        j.close()


def test_a_send_refused_before_it_left_is_not_sent_and_stays_so(journal_url: str) -> None:
    with Journal.create(journal_url) as journal:
        calls = OutwardCalls(journal)
        tries = []

        def refused() -> OutwardReply:
            tries.append(1)
            raise OutwardNotSent("not in the grant")

        first = calls.act(LINEAGE, "k", "0" * 64, "example.org:443", refused)
        assert first.outcome.status == "not-sent"
        assert "grant" in first.outcome.detail
        again = calls.act(LINEAGE, "k", "0" * 64, "example.org:443", refused)
        assert again.replayed
        assert len(tries) == 1


def test_recovery_records_unknown_for_intents_without_outcome(
    journal_url: str, server: CountingServer
) -> None:
    Journal.create(journal_url).close()
    target = f"http://127.0.0.1:{server.port}/lost"
    assert _crash_at(journal_url, "lost", target, "after-send").returncode == -9
    kept_at = f"http://127.0.0.1:{server.port}/kept"
    assert _crash_at(journal_url, "kept", kept_at, "none").returncode == 0
    with Journal.open(journal_url) as journal:
        calls = OutwardCalls(journal)
        assert calls.recover(LINEAGE) == 1  # only the one without an outcome
        assert calls.recover(LINEAGE) == 0  # once
        found = calls.recorded(LINEAGE, "lost")
        assert found is not None
        assert found[1] is not None
        assert found[1].status == "unknown"
        kept = calls.recorded(LINEAGE, "kept")
        assert kept is not None
        assert kept[1] is not None
        assert kept[1].status == "answered"
        assert server.sends("/lost") == 1
        assert audit_history(journal.payloads()).ok


def test_the_audit_finds_a_second_intent_and_an_outcome_without_one() -> None:
    def row(position: int, event: object) -> tuple[int, str, bytes]:
        payload = event.payload()  # type: ignore[attr-defined]
        doc = {"at": "2026-01-01T00:00:00+00:00", "payload": payload}
        return position, f"{type(event).__name__}/v1", json.dumps(doc).encode()

    intent = OutwardIntent(lineage=LINEAGE, key="k", attempt="a" * 32, digest="0" * 64,
                           destination="x:80")  # fmt: skip
    outcome = OutwardOutcome(lineage=LINEAGE, key="k", status="unknown")
    stray = OutwardOutcome(lineage=LINEAGE, key="never", status="unknown")
    clean = audit_history([[row(1, intent), row(2, outcome)]])
    assert clean.ok  # the positive control
    bad = audit_history([[row(1, intent), row(2, intent), row(3, outcome), row(4, outcome),
                          row(5, stray)]])  # fmt: skip
    found = [(f.check, f.position) for f in bad.findings]
    assert found == [("outward-call", 2), ("outward-call", 4), ("outward-call", 5)]
