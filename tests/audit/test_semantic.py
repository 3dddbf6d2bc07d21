"""charter audit: clean on histories the product makes; for each rule, a journal crafted
to break exactly that rule (entries appended past the control layer, as an attacker with
write access to the journal would) gives a finding of that check at that position.
SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

import pytest

import charter.catalogue  # noqa: F401  (journal.entries decodes every type)
from charter.audit import audit_chain
from charter.audit.semantic import audit_history
from charter.authority import AgentRegistered, Clearance, GrantMinted, Verdict, seal
from charter.budgets import LeaseReleased, UsageRecorded
from charter.core import Budget, KeyStore
from charter.core.events import Event
from charter.core.framing import entry_hash
from charter.core.lineage import Lineage
from charter.ledger import Journal
from charter.sandbox import SandboxExited, SandboxLeased, SandboxStarted, SandboxUsage
from tests.audit._support import Ping, _Raw, fill_real, make_journal, real_history


@pytest.fixture
def made(journal_url: str, tmp_path: Path) -> tuple[str, Path, list[str]]:
    home = tmp_path / "home"
    _, lineages = real_history(journal_url, home)
    report = _audit(journal_url)
    assert report.ok, report.findings  # positive control: the product's history is clean
    return journal_url, home, lineages


def _audit(url: str, as_of: int | None = None) -> Any:
    with Journal.open(url) as j:
        return audit_history(j.payloads(None, as_of))


def _append(url: str, *events: Event) -> list[int]:
    with Journal.open(url) as j:
        return [c.position for c in j.append(list(events))]


def _only(report: Any, check: str) -> list[int]:
    return sorted({f.position for f in report.findings if f.check == check})


def _event(url: str, type_name: str, **match: str) -> Any:
    with Journal.open(url) as j:
        for e in j.entries(types=[type_name]):
            if all(e.event.payload().get(k) == v for k, v in match.items()):
                return e.event
    raise AssertionError(f"no {type_name} {match}")


BIG = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB")
SMALL = Budget.parse("tokens=1,wall=1s,cpu=1s,mem=1KiB,egress=1KB")


def _usage(lineage: str, amount: Budget) -> UsageRecorded:
    zero = Budget.parse("tokens=0,wall=0s,cpu=0s,mem=0KiB,egress=0KB")
    return UsageRecorded(lineage=lineage, amount=amount, refused=zero, exhausted=False)


def test_overspending_a_lease_breaks_conservation(made: tuple) -> None:
    url, _, lineages = made
    (bad,) = _append(url, _usage(lineages[0], BIG))
    report = _audit(url)
    assert bad in _only(report, "conservation")
    assert {f.position for f in report.findings} == {bad}
    assert _audit(url, as_of=bad - 1).ok  # as of the position before, it was clean


def test_usage_after_a_release_is_found(made: tuple) -> None:
    url, _, lineages = made
    _append(url, LeaseReleased(lineage=lineages[1]))
    assert _audit(url).ok  # a release alone is fine
    (bad,) = _append(url, _usage(lineages[1], SMALL))
    assert _only(_audit(url), "usage-after-end") == [bad]


def test_a_forged_signature_breaks_the_grant_chain(made: tuple) -> None:
    url, _, lineages = made
    real = _event(url, "GrantMinted", lineage=lineages[2])
    forged = real.model_copy(update={"signature": "00" * 64})
    gate = _event(url, "GateDecided", actor="agent:estate")
    gate2 = gate.model_copy(update={"fanout": "f-forged"})
    _, bad = _append(url, gate2, forged.model_copy(update={"fanout": "f-forged"}))
    report = _audit(url)
    assert _only(report, "grant-chain") == [bad]
    assert {f.position for f in report.findings} == {bad}


def test_a_wider_child_grant_signed_by_the_real_parent_key_is_found(made: tuple) -> None:
    url, home, lineages = made
    real = _event(url, "GrantMinted", lineage=lineages[2]).sealed().grant
    wider = real.model_copy(
        update={
            "lineage": Lineage("agent:estate/sa-9"),
            "terms": real.terms.model_copy(update={"clearance": Clearance.SECRET}),
        }
    )
    sealed = seal(wider, KeyStore(home).load("agent-estate"))
    gate = _event(url, "GateDecided", actor="agent:estate").model_copy(update={"fanout": "f-w"})
    _, bad = _append(url, gate, GrantMinted.of("f-w", sealed))
    findings = [f for f in _audit(url).findings if f.check == "grant-chain"]
    assert [f.position for f in findings] == [bad]
    assert "clearance" in findings[0].detail.lower()


def test_a_second_registration_and_root_grant_are_found(made: tuple) -> None:
    """A root's trust root and root grant are write-once: a second registration (a
    foreign trust root) and a replayed root grant are trust-anchor findings, and the
    first registration's trust root keeps verifying (tests/audit/test_anchors.py has
    the whole takeover)."""
    url, _, _ = made
    (bad,) = _append(
        url, AgentRegistered(name="estate", lineage="agent:estate", trust_root="ab" * 32)
    )
    root = _event(url, "GrantMinted", lineage="agent:estate")
    (mint,) = _append(url, root.model_copy(update={"fanout": "register:again"}))
    report = _audit(url)
    assert _only(report, "trust-anchor") == [bad, mint]
    assert _only(report, "grant-chain") == []


def test_mints_without_a_gate_or_with_a_second_gate_are_found(made: tuple) -> None:
    url, _, lineages = made
    real = _event(url, "GrantMinted", lineage=lineages[2])
    (nogate,) = _append(url, real.model_copy(update={"fanout": "f-nogate"}))
    gate = _event(url, "GateDecided", actor="agent:estate")
    (twice,) = _append(url, gate)  # the same fan-out's gate decided again
    negative = gate.model_copy(update={"fanout": "f-neg", "verdict": Verdict.NEGATIVE})
    _, refused = _append(url, negative, real.model_copy(update={"fanout": "f-neg"}))
    assert _only(_audit(url), "gate") == [nogate, twice, refused]


def _leased(sandbox: str, lineage: str | None) -> SandboxLeased:
    return SandboxLeased(
        sandbox_id=sandbox,
        host_uid=100_000,
        pool=None,
        budget=SMALL,
        pids_max=64,
        memory_bytes=1 << 20,
        cpu_quota_us=10_000,
        cpu_period_us=100_000,
        wall_ms=1000,
        egress=(),
        lineage=lineage,
        lease=lineage,
    )


def test_a_sandbox_for_a_lineage_without_grant_or_live_lease_is_found(made: tuple) -> None:
    url, _, lineages = made
    (ok_pos,) = _append(url, _leased("s-ok", lineages[0]))
    (nogrant,) = _append(url, _leased("s-nogrant", "agent:estate/sa-9"))
    (started,) = _append(url, SandboxStarted(sandbox_id="s-ghost", pid=1, command=("true",)))
    _append(url, LeaseReleased(lineage=lineages[1]))
    (dead,) = _append(url, _leased("s-dead", lineages[1]))
    assert _only(_audit(url), "sandbox-lease") == [nogrant, started, dead]
    del ok_pos


def test_a_started_sandbox_whose_lease_ended_without_an_exit_is_found(made: tuple) -> None:
    url, _, lineages = made
    _append(url, _leased("s1", lineages[0]), _leased("s2", lineages[2]))
    (s1,) = _append(url, SandboxStarted(sandbox_id="s1", pid=10, command=("true",)))
    _append(url, SandboxStarted(sandbox_id="s2", pid=11, command=("true",)))
    assert _audit(url).ok  # both still live: their leases have not ended
    usage = SandboxUsage(wall_ms=1, cpu_ms=1, memory_peak_bytes=1, oom_kills=0, pids_limit_hits=0)
    _append(url, SandboxExited(sandbox_id="s2", exit_code=0, how="exited", usage=usage))
    _append(url, LeaseReleased(lineage=lineages[0]), LeaseReleased(lineage=lineages[2]))
    assert _only(_audit(url), "lifecycle") == [s1]


def test_a_mint_under_a_released_subtree_is_found(made: tuple) -> None:
    url, _, lineages = made
    worker = lineages[0]  # agent:estate/sa-1, which minted two children
    _append(url, LeaseReleased(lineage=worker))
    real = _event(url, "GrantMinted", lineage=lineages[3])
    gate = _event(url, "GateDecided", actor=worker).model_copy(update={"fanout": "f-after"})
    _, bad = _append(url, gate, real.model_copy(update={"fanout": "f-after"}))
    assert _only(_audit(url), "revoked-subtree") == [bad]


def test_an_entry_committed_earlier_than_its_predecessor_is_found(made: tuple) -> None:
    """Raw SQL, as an attacker would: a row appended with an earlier commit time."""
    url, _, _ = made
    with Journal.open(url) as j:
        last = list(j.rows())[-1]
    doc = json.loads(last.state)
    doc["at"] = "2001-01-01T00:00:00.000000+00:00"
    state = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    position = last.position + 1
    chain = entry_hash(
        last.chain_hash, position, last.originator, last.version + 1, last.topic.encode(), state
    )
    with _Raw(url) as raw:
        oid: Any = (
            last.originator.hex() if raw.sqlite else __import__("uuid").UUID(bytes=last.originator)
        )
        raw.execute(
            f"INSERT INTO {raw.table} ({raw.pos}, originator_id, originator_version, topic, "
            "state, prev_hash, chain_hash) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (position, oid, last.version + 1, last.topic, state, last.chain_hash, chain),
        )
    with Journal.open(url) as j:
        assert audit_chain(j).ok  # the chain is intact: only the rule is broken
    assert _only(_audit(url), "commit-order") == [position]


def test_histories_without_authority_events_are_clean(journal_url: str) -> None:
    journal, _ = make_journal(journal_url)
    with journal:
        fill_real(journal, 10)
        report = audit_history(journal.payloads())
    assert report.ok
    assert report.checked == 30


def test_an_entry_of_a_type_charter_never_writes_is_found(journal_url: str) -> None:
    """Entries of types the audit does not know (the journal tests' own Ping and
    Counter, validly chained) are findings at their positions; no rule reads them, so
    passing them would let any unknown entry through."""
    journal, _ = make_journal(journal_url)
    with journal:
        fill_real(journal, 2)
        (ping,) = journal.append([Ping(writer="x", batch=0, n=0, pad="")])
        fill_real(journal, 1)
        report = audit_history(journal.payloads())
    assert [(f.check, f.position) for f in report.findings] == [("entry-type", ping.position)]


def test_the_generated_projection_history_keeps_every_budget_rule(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/projections/history.py decides its budgets with the lease book, so every
    budget rule holds; it writes placeholder grants (no signature, no gate), which the
    auditor reports as such: an audit that passed them would be the bug."""
    from charter.ledger import _rows
    from tests.projections.history import History, now_ms

    # The history decides at a time of the test's own, which also stamps its entries: a
    # decision and its entry share one time, as the product's pinned appends ensure (on
    # the wall clock, a usage decided just before a short lease's end could be stamped
    # after it on a loaded machine, and the audit would rightly report it).
    clock = [now_ms()]

    class _Stamp(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> _Stamp:
            return cls.fromtimestamp(clock[0] / 1000, tz)

    monkeypatch.setattr(_rows, "datetime", _Stamp)
    history = History(7, clock=lambda: clock[0])
    with Journal.create(sqlite_url) as j:
        j.append(history.genesis())
        for _ in range(300):
            clock[0] += 10  # 3 s of history: its 150-600 ms leases end within it
            batch = history.step()
            if batch:
                j.append(batch)
        report = audit_history(j.payloads())
    checks = {f.check for f in report.findings}
    assert checks == {"grant-chain", "gate"}
    assert all(
        "does not parse" in f.detail or "holds no grant" in f.detail
        for f in report.findings
        if f.check == "grant-chain"
    )


def test_charter_audit_exits_3_with_the_findings(made: tuple, tmp_path: Path) -> None:
    from tests.audit.test_cli_audit import charter

    url, home, lineages = made
    clean = charter("--json", "audit", home=home, db=url)
    assert clean.returncode == 0, clean.stderr
    with Journal.open(url) as j:
        entries = len(list(j.rows()))
    assert json.loads(clean.stdout) == {"ok": True, "checked": entries, "findings": []}
    (bad,) = _append(url, _usage(lineages[0], BIG))
    found = charter("--json", "audit", home=home, db=url)
    assert found.returncode == 3, found.stderr
    doc = json.loads(found.stdout)
    assert doc["ok"] is False
    assert [(f["check"], f["position"], f["lineage"]) for f in doc["findings"]] == [
        ("conservation", bad, lineages[0])
    ]
    as_of = charter("--json", "audit", "--as-of", str(bad - 1), home=home, db=url)
    assert as_of.returncode == 0, as_of.stderr
    text = charter("audit", home=home, db=url)
    assert text.returncode == 3
    assert "conservation" in text.stdout
