"""``sandbox: own`` delegation through the door, in real sandboxes (both backends;
docs/delegation.md): the delegate reaches only its own destinations, with its own held
secret presented by the broker, never the caller's destination; the caller reaches only
its own, never the delegate's, and gets only the reply; a delegate cannot delegate or
spawn; a delegation its caller cannot pay for is refused before anything starts; the
journal holds delegation, reservation, start and reply in that order, and the audit
and the independent fold are clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from charter.audit.semantic import audit_history
from charter.authority import GrantMinted, SpawnRefused
from charter.budgets import LeaseGranted
from charter.control import (
    DelegationRefused,
    DelegationReplied,
    DelegationRequested,
    WorkerScheduled,
)
from charter.core.secrets import HeldSecret, SecretStore
from charter.runner.events import WorkerResult, WorkerStarted
from tests.runner._delegate_support import (
    CALLER,
    DELEGATE_BUDGET,
    FETCHER,
    GREEDY_BUDGET,
    SLOT,
    folds_clean,
    own_agent,
    spawn_caller,
)
from tests.runner._outward_server import CountingServer
from tests.runner._support import make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.sandbox._creds_support import PKI, Server

TOKEN = "delegate-token-5f0e9c1d2b3a4f5e6d7c"


@pytest.mark.sandbox
def test_a_delegate_runs_under_its_own_grant_and_only_its_reply_comes_back(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    pki = PKI()
    tls = Server(pki, "localhost")  # the delegate's own destination, behind its token
    mine = CountingServer()  # the caller's own destination
    theirs = [f"localhost:{tls.port}", f"127.0.0.1:{tls.port}"]
    SecretStore(home).add(
        HeldSecret("tok", "bearer", (theirs[0],), value=TOKEN.encode(), ca=pki.pem)
    )
    caller_url, tls_url = f"http://127.0.0.1:{mine.port}/", f"http://localhost:{tls.port}/"
    try:
        with initialise(journal_url, home, egress=frozenset({f"127.0.0.1:{mine.port}"})) as charter:
            own_agent(charter, "fetcher", FETCHER, tls_url,
                      egress=frozenset(theirs), secrets=frozenset({"tok"}))  # fmt: skip
            own_agent(charter, "greedy", FETCHER, tls_url, budget=GREEDY_BUDGET)
            caller = spawn_caller(
                charter, CALLER, caller_url, tls_url, egress=[f"127.0.0.1:{mine.port}"]
            )
            with running(make_cell(charter, None, state_dir, door=True, budget=SLOT)) as cell:
                until_idle(cell, timeout=300)
            entries = list(charter.journal.entries())
            payloads = list(charter.journal.payloads())
            results = {
                e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerResult)
            }
            out = json.loads(results[caller].text)
            reply = out["reply"]
            delegate = reply["delegate"]

            # Only the reply comes back: its status and its text, nothing of its exit,
            # stderr or reason.
            assert set(reply) == {"delegate", "status", "reply", "digest", "timed_out"}, reply
            assert reply["status"] == "exited", reply
            assert reply["digest"] == results[delegate].digest
            assert delegate.startswith("agent:fetcher/sa-")
            told = json.loads(reply["reply"])

            # The delegate reached its own destination with its own secret (presented
            # by the broker), and not the caller's.
            assert told["own"][0].endswith("200 OK"), told["own"]
            assert told["own"][1].startswith("ok with-authorization"), told["own"]
            assert [s.headers.get("authorization") for s in tls.seen] == [f"Bearer {TOKEN}"]
            assert told["theirs"][0].split()[1] == "403", told["theirs"]
            # The token never entered its environment.
            assert TOKEN not in json.dumps(told["env"])
            assert TOKEN not in told["environ"]
            assert "CHARTER_EGRESS_SOCKET" in told["environ"]  # positive control: read
            # Nested: a delegate cannot delegate (journaled), nor spawn (no depth left).
            assert told["nested"] == [-32000, "nested-delegation"]
            assert told["spawned"] == [-32000, "depth-exhausted"]

            # The caller: its own destination yes (positive control), the delegate's no.
            assert out["mine"][0].split()[1] == "201", out["mine"]
            assert out["theirs"][0].split()[1] == "403", out["theirs"]
            assert mine.sends("/") == 1  # the caller's GET; the delegate's never arrived
            assert len(tls.seen) == 1  # the delegate's GET; the caller's never arrived

            # Too little left: refused before anything started; an unknown agent too.
            assert out["greedy"] == [-32000, "insufficient-budget"]
            assert out["unknown"] == [-32000, "not-own-sandbox"]
            refused = [e.event for e in entries if isinstance(e.event, DelegationRefused)]
            assert sorted((r.caller, r.agent, r.reason) for r in refused) == sorted([
                (caller, "greedy", "insufficient-budget"),
                (caller, "nobody", "not-own-sandbox"),
                (delegate, "fetcher", "nested-delegation"),
            ])  # fmt: skip
            assert any(
                isinstance(e.event, SpawnRefused) and e.event.actor == caller for e in entries
            )  # the reservation's refusal, out of the caller's lease
            for e in entries:
                lineage = str(getattr(e.event, "lineage", ""))
                assert not lineage.startswith("agent:greedy/"), e.event  # nothing minted
                if isinstance(e.event, LeaseGranted):
                    assert not any(x.startswith("agent:greedy/") for x in e.event.lineages)

            # The delegate's grant is the agent's profile, not the caller's.
            grants = {str(e.event.lineage): e.event.sealed() for e in entries
                      if isinstance(e.event, GrantMinted)}  # fmt: skip
            terms = grants[delegate].grant.terms
            assert {str(d) for d in terms.egress} == set(theirs)
            assert terms.secrets == frozenset({"tok"})
            assert (terms.depth, terms.fanout) == (0, 0)
            assert terms.budget == DELEGATE_BUDGET
            assert grants[caller].grant.terms.secrets == frozenset()
            assert {str(d) for d in grants[caller].grant.terms.egress} == {f"127.0.0.1:{mine.port}"}

            # Delegation, reservation (out of the caller's lease), start and reply, in order.
            pos: dict[str, int] = {}
            for e in entries:
                ev = e.event
                if isinstance(ev, DelegationRequested) and ev.delegate == delegate:
                    pos["delegation"] = e.position
                    assert ev.caller == caller
                elif isinstance(ev, LeaseGranted) and delegate in ev.lineages:
                    pos["reservation"] = e.position
                    assert ev.parent == caller
                elif isinstance(ev, WorkerStarted) and ev.lineage == delegate:
                    pos["start"] = e.position
                elif isinstance(ev, DelegationReplied) and ev.delegate == delegate:
                    pos["reply"] = e.position
                    assert (ev.caller, ev.outcome) == (caller, "exited")
                elif isinstance(ev, WorkerScheduled) and ev.lineage == delegate:
                    assert ev.inputs == (caller_url,)  # the caller's input, its only say
            assert pos["delegation"] < pos["reservation"] < pos["start"] < pos["reply"], pos
            assert all(TOKEN not in repr(p) for p in payloads)
            findings = audit_history(payloads).findings
            assert findings == (), findings
            folds_clean(charter.journal)
    finally:
        tls.close()
        mine.close()
