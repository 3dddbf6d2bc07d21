"""Audit rules for what the control plane enforces (issue 24, 2). Each attack is a run
of validly chained entries appended past the control layer, as an attacker with write
access to the journal would; each passed ``charter audit`` before its rule, and each
has a positive control. SQLite and PostgreSQL. Also: the rule table of
docs/VERIFYING.md §9 names exactly the audit's checks, and the audit knows exactly the
types Charter writes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import charter.catalogue  # noqa: F401  (registers every event type)
from charter.audit.semantic import CHECKS, KNOWN_TOPICS, RULES
from charter.authority import GrantMinted, seal
from charter.budgets import (
    CellConfigured,
    LeaseGranted,
    LeaseReleased,
    SlotAdmitted,
    SlotQueued,
    SlotReleased,
)
from charter.budgets.admission import ResourceClass
from charter.core import Budget, KeyStore
from charter.core.events import event_types
from charter.core.lineage import Lineage
from charter.runner import CellStarted, WorkerEnded, WorkerStarted
from charter.sandbox import SandboxExited, SandboxStarted, SandboxUsage
from tests.audit.test_semantic import _append, _audit, _event, _leased, _only, _usage, made

__all__ = ["made"]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "VERIFYING.md"
USAGE = SandboxUsage(wall_ms=1, cpu_ms=1, memory_peak_bytes=1, oom_kills=0, pids_limit_hits=0)


def test_a_gate_for_one_child_does_not_cover_five_mints(made: tuple) -> None:
    url, home, _ = made
    root = _event(url, "GrantMinted", lineage="agent:estate").sealed()
    template = _event(url, "GrantMinted", lineage="agent:estate/sa-3").sealed().grant
    key = KeyStore(home).load("agent-estate")
    gate = _event(url, "GateDecided", actor="agent:estate").model_copy(
        update={"fanout": "f-one", "width": 1}
    )
    mints = [
        GrantMinted.of(
            "f-one",
            seal(
                template.model_copy(
                    update={
                        "lineage": Lineage(f"agent:estate/sa-{n}"),
                        "parent_digest": root.digest.hex(),
                    }
                ),
                key,
            ),
        )
        for n in range(11, 16)
    ]
    _, first, *more = _append(url, gate, *mints)
    report = _audit(url)
    assert _only(report, "gate") == more
    assert {f.position for f in report.findings} == set(more)  # the chains verify
    assert _audit(url, as_of=first).ok  # positive control: the one child it allowed


def test_re_leasing_a_live_lineage_does_not_reset_its_spend(made: tuple) -> None:
    url, _, lineages = made
    lease = _event(url, "LeaseGranted", parent="agent:estate")
    spend = Budget.parse("tokens=1000,wall=1s,cpu=1s,mem=1KiB,egress=1KB")
    (first,) = _append(url, _usage(lineages[0], spend))
    assert _audit(url).ok  # positive control: 1000 + 2000 leased to its children, of 3333
    again = LeaseGranted(
        parent="agent:estate",
        lineages=(lineages[0],),
        allocation=lease.allocation,
        expires_at_ms=lease.expires_at_ms,
    )
    (released,) = _append(url, again)
    (second,) = _append(url, _usage(lineages[0], spend))
    report = _audit(url)
    assert _only(report, "lineage-reuse") == [released]
    assert _only(report, "conservation") == [second]  # the first spend still counts
    del first


def _cell_started(incarnation: int = 1, claim_ms: int = 3_600_000) -> CellStarted:
    """Cell ``local``'s incarnation, holding a claim for ``claim_ms`` from now (a worker
    is started only under its cell's claim: ``cell-claim``)."""
    until = int(time.time() * 1000) + claim_ms
    return CellStarted(cell="local", incarnation=incarnation, pid=1, host="h", claim_until_ms=until)


def _admitted(lineage: str, cap: int = 3, cell: str = "t") -> SlotAdmitted:
    return SlotAdmitted(
        cell=cell, lineage=lineage, resource=ResourceClass.PROCESSING, cap=cap, occupancy=1
    )


# A cell of the attacker's tests: its processing cap is 3 (the real history's own cell
# has an adaptive cap that depends on the host's load).
CELL = CellConfigured(cell="t", caps={ResourceClass.PROCESSING: 3}, cores=4, failover_reserve=1)


def test_admissions_past_a_cells_cap_are_found(made: tuple) -> None:
    """The attacker's admissions declare a cap of 100 on a cell configured with 3."""
    url, _, _ = made
    _append(url, CELL, *(_admitted(f"x{n}") for n in range(3)))
    assert _audit(url).ok  # positive control: 3 of 3
    over = _append(url, *(_admitted(f"y{n}", cap=100) for n in range(2)))
    (nowhere,) = _append(url, _admitted("z", cell="elsewhere"))
    assert _only(_audit(url), "admission") == [*over, nowhere]


def test_admissions_out_of_queue_order_are_found(made: tuple) -> None:
    url, _, _ = made
    queued = SlotQueued(
        cell="t",
        lineages=("q1", "q2", "q3"),
        resource=ResourceClass.PROCESSING,
        cap=0,
        occupancy=0,
    )
    _append(url, queued, CELL, _admitted("q1"))
    assert _audit(url).ok  # positive control: the head first (1 of 3 held)
    (jump,) = _append(url, _admitted("q3"))
    release = SlotReleased(cell="t", lineage="q3", resource=ResourceClass.PROCESSING)
    _append(url, release)
    (stranger,) = _append(url, _admitted("q9"))  # not queued at all, while q2 waits
    _append(url, _admitted("q2"))  # now the head: in order, 3 of 3
    findings = [f for f in _audit(url).findings if f.check == "admission"]
    assert [f.position for f in findings] == [jump, stranger]
    assert all("ahead of the queue's head q2" in f.detail for f in findings)


def test_an_operator_sandbox_is_exempt_only_as_documented(made: tuple) -> None:
    url, _, lineages = made
    operator = _leased("s-op", None)
    (fine,) = _append(url, operator)
    _append(url, SandboxStarted(sandbox_id="s-op", pid=5, command=("true",)))
    _append(url, SandboxExited(sandbox_id="s-op", exit_code=0, how="exited", usage=USAGE))
    assert _audit(url).ok  # positive control: an operator's run that ended
    (claims,) = _append(
        url, operator.model_copy(update={"sandbox_id": "s-claim", "lease": Lineage(lineages[0])})
    )
    _append(url, operator.model_copy(update={"sandbox_id": "s-w"}), _cell_started())
    (worker,) = _append(
        url, WorkerStarted(lineage=lineages[1], cell="local", incarnation=1, sandbox_id="s-w")
    )
    (hung,) = _append(url, SandboxStarted(sandbox_id="s-w", pid=6, command=("true",)))
    time.sleep(1.1)  # past the operator sandbox's wall clock (1000 ms)
    _append(url, LeaseReleased(lineage=lineages[2]))
    report = _audit(url)
    assert _only(report, "sandbox-lease") == [claims]
    assert _only(report, "worker-lifecycle") == [worker]
    assert _only(report, "lifecycle") == [hung]
    del fine


def test_a_started_worker_that_never_ends_is_found(made: tuple) -> None:
    url, _, lineages = made
    _append(url, _cell_started(), _leased("s1", lineages[0]), _leased("s2", lineages[1]))
    (open_,) = _append(
        url, WorkerStarted(lineage=lineages[0], cell="local", incarnation=1, sandbox_id="s1")
    )
    _append(url, WorkerStarted(lineage=lineages[1], cell="local", incarnation=1, sandbox_id="s2"))
    _append(url, WorkerEnded(lineage=lineages[1], outcome="exited", exit_code=0, sandbox_id="s2"))
    _append(url, LeaseReleased(lineage=lineages[1]))
    assert _audit(url).ok  # positive control: one ended, one still running under its lease
    _append(url, LeaseReleased(lineage=lineages[0]))
    assert _only(_audit(url), "worker-lifecycle") == [open_]


def test_a_worker_started_without_a_grant_is_found(made: tuple) -> None:
    url, _, _ = made
    _append(url, _cell_started(), _leased("s9", "agent:estate/sa-9"))
    (bad,) = _append(
        url,
        WorkerStarted(lineage="agent:estate/sa-9", cell="local", incarnation=1, sandbox_id="s9"),
    )
    assert bad in _only(_audit(url), "worker-lifecycle")


def test_the_audit_knows_exactly_the_types_charter_writes() -> None:
    charters = {c.topic() for c in event_types().values() if c.__module__.startswith("charter.")}
    assert charters == KNOWN_TOPICS


def _doc_table() -> list[tuple[str, str]]:
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("### Enforced rules and their audit checks", 1)[1]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = [line for line in lines[start:end] if "---" not in line]
    out = []
    for line in rows[1:]:  # the header first
        rule, check = (cell.strip() for cell in line.strip("|").split("|"))
        out.append((rule, check.strip("`")))
    return out


def test_the_docs_rule_table_is_the_audits() -> None:
    """docs/VERIFYING.md §9 maps each rule the control plane enforces to its check:
    the same rows as semantic.RULES, and every check named is one the audit has."""
    table = _doc_table()
    assert table == list(RULES)
    assert {check for _, check in table} <= set(CHECKS)
    assert set(CHECKS) - {check for _, check in table} == set()
    checks_doc = re.findall(r"^\| `([a-z-]+)` \|", DOCS.read_text(encoding="utf-8"), re.M)
    assert set(CHECKS) <= set(checks_doc)


def test_a_sandbox_naming_another_grant_is_found(made: tuple) -> None:
    url, _, lineages = made
    own = _event(url, "GrantMinted", lineage=lineages[0]).sealed().digest.hex()
    other = _event(url, "GrantMinted", lineage=lineages[1]).sealed().digest.hex()
    _append(url, _leased("s-own", lineages[0]).model_copy(update={"grant_digest": own}))
    assert _audit(url).ok  # positive control: its own grant
    (bad,) = _append(
        url, _leased("s-other", lineages[0]).model_copy(update={"grant_digest": other})
    )
    assert _only(_audit(url), "sandbox-lease") == [bad]


def test_a_lease_to_a_lineage_without_its_grant_is_found(made: tuple) -> None:
    url, _, _ = made
    lease = _event(url, "LeaseGranted", parent="agent:estate")
    assert len(lease.grants) == 3  # the product names each child's grant
    small = Budget.parse("tokens=1,wall=1s,cpu=1s,mem=1KiB,egress=1KB")
    (nogrant,) = _append(
        url,
        LeaseGranted(
            parent="agent:estate",
            lineages=("agent:estate/sa-9",),
            allocation=small,
            expires_at_ms=lease.expires_at_ms,
        ),
    )
    (wrong,) = _append(
        url,
        LeaseGranted(
            parent="agent:estate",
            lineages=("agent:estate/sa-8",),
            allocation=small,
            expires_at_ms=lease.expires_at_ms,
            grants=(lease.grants[0],),
        ),
    )
    assert _only(_audit(url), "grant-chain") == [nogrant, wrong]
