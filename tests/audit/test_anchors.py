"""Trust anchors are write-once (issue 24, 1): with write access to the journal and no
key, an attacker appends a second registration of an existing root under their own
trust root, a root grant they sign themselves, a fresh budget ledger, a child, its
lease and its usage, every entry validly chained. The audit finds the second
registration and the second ledger at their positions, and every grant of the forged
chain fails to verify against the first trust root; the projections keep showing the
first ledger and the first registration. SQLite and PostgreSQL."""

from __future__ import annotations

import json

from nacl.signing import SigningKey

from charter.authority import AgentRegistered, GrantMinted, seal
from charter.budgets import BudgetLedgerOpened, LeaseGranted
from charter.core import Budget
from charter.core.lineage import Lineage
from charter.ledger import Journal
from tests.audit.test_semantic import _append, _audit, _event, _only, _usage, made

__all__ = ["made", "takeover"]

HUGE = Budget.parse("tokens=900M,wall=100h,cpu=100h,mem=800GiB,egress=100GB")
SPEND = Budget.parse("tokens=900k,wall=1m,cpu=1m,mem=1MiB,egress=1MB")


def takeover(url: str) -> dict[str, int]:
    """The attacker's entries; their positions by name."""
    attacker = SigningKey.generate()
    public = bytes(attacker.verify_key).hex()
    real_root = _event(url, "GrantMinted", lineage="agent:estate").sealed().grant
    root = seal(real_root.model_copy(update={"subject_key": public}), attacker)
    child_terms = _event(url, "GrantMinted", lineage="agent:estate/sa-1").sealed().grant
    child = seal(
        child_terms.model_copy(
            update={
                "lineage": Lineage("agent:estate/sa-7"),
                "subject_key": public,
                "parent_digest": root.digest.hex(),
            }
        ),
        attacker,
    )
    gate = _event(url, "GateDecided", actor="agent:estate").model_copy(
        update={"fanout": "f-takeover", "width": 1}
    )
    expires = _event(url, "LeaseGranted", parent="agent:estate").expires_at_ms
    positions = _append(
        url,
        AgentRegistered(name="estate", lineage="agent:estate", trust_root=public),
        GrantMinted.of("register:estate", root),
        BudgetLedgerOpened(lineage="agent:estate", allocation=HUGE),
        gate,
        GrantMinted.of("f-takeover", child),
        LeaseGranted(
            parent="agent:estate",
            lineages=("agent:estate/sa-7",),
            allocation=HUGE,
            expires_at_ms=expires,
        ),
    )
    (usage,) = _append(url, _usage("agent:estate/sa-7", SPEND))
    names = ("registered", "root", "ledger", "gate", "child", "lease")
    return {**dict(zip(names, positions, strict=True)), "usage": usage}


def test_a_second_registration_of_a_root_is_found(made: tuple) -> None:
    url, _, _ = made
    at = takeover(url)
    report = _audit(url)
    assert _only(report, "trust-anchor") == [at["registered"], at["root"], at["ledger"]]
    # The first root grant stays, so the child minted under the forged one does not
    # verify (its parent digest names the forged grant), nor does its lease.
    assert _only(report, "grant-chain") == [at["child"], at["lease"]]
    assert not report.ok
    assert _audit(url, as_of=at["registered"] - 1).ok  # positive control


def test_a_second_ledger_does_not_reset_the_roots_budget(made: tuple) -> None:
    """The lease granted out of the attacker's huge ledger is charged to the first one,
    which it overspends."""
    url, _, _ = made
    at = takeover(url)
    assert at["lease"] in _only(_audit(url), "conservation")


def test_the_projections_keep_the_first_anchors(made: tuple) -> None:
    """The budgets and tree projections, followed incrementally and rebuilt, show the
    first ledger and the first registration; before, the second ledger replaced the
    root's budget."""
    from charter.projections import Projector

    url, _, _ = made
    first = _event(url, "BudgetLedgerOpened", lineage="agent:estate")
    with Journal.open(url) as j:
        registered = next(e.position for e in j.entries(types=["AgentRegistered"]))
        Projector(j).catch_up()  # followed up to before the attack (then incrementally)
    takeover(url)
    with Journal.open(url) as j:
        for projector, rebuilt in ((Projector(j), False), (Projector(j, "fresh"), True)):
            if rebuilt:
                projector.rebuild()
            else:
                projector.catch_up()
            root = projector.budgets("agent:estate").get("agent:estate")
            assert root.allocation == first.allocation, rebuilt
            node = next(n for n in projector.tree().nodes if n.lineage == "agent:estate")
            assert node.position == registered, rebuilt
            projector.close()


def test_charter_audit_exits_3_on_the_takeover(made: tuple) -> None:
    from tests.audit.test_cli_audit import charter

    url, home, _ = made
    at = takeover(url)
    found = charter("--json", "audit", home=home, db=url)
    assert found.returncode == 3, found.stderr
    checks = {(f["check"], f["position"]) for f in json.loads(found.stdout)["findings"]}
    assert ("trust-anchor", at["registered"]) in checks
    assert ("trust-anchor", at["ledger"]) in checks
