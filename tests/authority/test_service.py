"""The service: the directory, one atomic append per fan-out, grants only after commit."""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from charter.authority import (
    FanoutCommand,
    FixedPolicy,
    ParentState,
    Verdict,
    decide,
    errors,
    verify_grant_chain,
)
from charter.budgets import CapInputs, ResourceClass
from charter.control import (
    DEFAULT_CELL,
    AdmissionService,
    AgentRecord,
    Ceiling,
    SpawnService,
    WorkerSpec,
    register_root,
)
from charter.core import Event, KeyStore
from charter.ledger import AppendConflictError, AppendFailedError, Committed, Journal
from tests.authority._support import BIG, COST, intent
from tests.authority.conftest import CEILING


def test_register_root_makes_a_0600_custody_key_and_journals_the_directory_entry(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    path = keystore.directory / "agent-root.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(keystore.directory.stat().st_mode) == 0o700
    assert bytes(keystore.load("agent-root").verify_key) == root.trust_root
    types = [e.type_name for e in journal.entries()]
    assert types == ["AgentRegistered", "GrantMinted", "BudgetLedgerOpened"]
    assert root.ceiling is not None
    assert verify_grant_chain([root.ceiling], root.trust_root).terms == CEILING.terms(
        root.ceiling.grant.issued_at_ms
    )
    # The private key is nowhere in the journal.
    seed = bytes(keystore.load("agent-root")).hex()
    assert all(seed not in str(e.event.payload()) for e in journal.entries())


def test_a_second_registration_of_a_name_is_refused_and_leaves_no_key(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    with pytest.raises(errors.AgentExistsError):
        register_root(journal, keystore, "root", CEILING)
    record = register_root(journal, keystore, "second", Ceiling(budget=BIG))
    svc = SpawnService(journal, keystore=keystore)
    assert [a.name for a in svc.agents()] == ["root", "second"]
    assert record.trust_root != root.trust_root
    with pytest.raises(errors.UnknownAgentError):
        svc.agent("nobody")


def test_ephemeral_workers_are_never_in_the_directory(
    service: SpawnService, journal: Journal
) -> None:
    root = service.durable_caller("root")
    workers = service.spawn(root, intent(5)).children
    service.spawn(root.child(workers[0]), intent(2, cost=COST.split(64 * 5 * 2)))
    assert [a.name for a in service.agents()] == ["root"]
    assert len(list(journal.entries(types=("AgentRegistered",)))) == 1
    assert len(list(journal.entries(types=("GrantMinted",)))) == 1 + 5 + 2


def test_one_fan_out_is_one_contiguous_append_gate_first(
    service: SpawnService, journal: Journal
) -> None:
    before = journal.head()
    assert before is not None
    result = service.spawn(service.durable_caller("root"), intent(50))
    entries = list(journal.entries(start=before[0] + 1))
    # the gate, the mints and (the budget stage) a lease for each child, in one append;
    # no place on a cell: these children run nothing, so they take no slot
    types = ["GateDecided"] + ["GrantMinted"] * 50 + ["LeaseGranted"]  # one lease event
    assert [e.type_name for e in entries] == types
    assert result.positions == (entries[0].position, entries[-1].position)
    assert {e.recorded_at for e in entries} == {entries[0].recorded_at}  # one commit
    minted = [e.event for e in entries[1:51]]
    assert [m.lineage for m in minted] == [c.lineage for c in result.children]  # type: ignore[attr-defined]
    assert {m.fanout for m in minted} == {result.fanout_id}  # type: ignore[attr-defined]
    # Each journaled grant is exactly what was handed out, and it verifies.
    root = service.durable_caller("root")
    for m, child in zip(minted, result.children, strict=True):
        sealed = m.sealed()  # type: ignore[attr-defined]
        assert sealed.body == child.sealed.body
        assert sealed.signature == child.sealed.signature
        verify_grant_chain([root.chain[0], sealed], service.agent("root").trust_root)


def test_a_fan_out_admits_to_free_slots_and_queues_the_rest_in_its_one_append(
    service: SpawnService, journal: Journal
) -> None:
    AdmissionService(journal).configure(
        DEFAULT_CELL, {ResourceClass.PROCESSING: 3}, cores=3, failover_reserve=0
    )
    # The host's load is pinned (the adaptive cap has its own tests): a cap of exactly 3.
    service.host_load = lambda cores, reserve: CapInputs(
        cores=cores, failover_reserve=reserve, load_average=0.0, live_peers=0
    )
    root = service.durable_caller("root")
    runs = (WorkerSpec(argv=("/bin/true",)),)  # children that run take slots
    first = service.spawn(root, intent(5), runs)
    entries = list(journal.entries(start=first.positions[0], stop=first.positions[1]))
    placed = [e.event for e in entries if e.type_name in ("SlotAdmitted", "SlotQueued")]
    lineages = [str(c.lineage) for c in first.children]
    named = [
        (type(p).__name__, getattr(p, "lineage", None) or tuple(getattr(p, "lineages", ())))
        for p in placed
    ]
    assert named == [
        *(("SlotAdmitted", lin) for lin in lineages[:3]),
        ("SlotQueued", tuple(lineages[3:])),  # the rest, in order, in one event
    ]
    assert first.admitted == tuple(lineages[:3])
    assert first.queued == tuple(lineages[3:])
    # The cell is full: a second fan-out is queued whole, behind the first one's queue.
    assert service.spawn(root, intent(2)).queued == ()  # the control: nothing to run
    second = service.spawn(root, intent(2), runs)
    assert second.admitted == ()
    assert len(second.queued) == 2
    slots = journal.entries(types=("SlotAdmitted",))
    assert max(e.event.occupancy for e in slots) == 3  # type: ignore[attr-defined]


class FailingJournal(Journal):
    """The real journal, whose appends fail as a lost database would make them."""

    def append(
        self,
        events: Iterable[Event],
        *,
        expect: Mapping[str, int] | None = None,
        tracking: tuple[str, int] | None = None,
        deadline_ms: int | None = None,
        batch: str | None = None,
        expect_head: int | None = None,
        not_before_ms: int | None = None,
    ) -> tuple[Committed, ...]:
        del events, expect, tracking, deadline_ms, batch, expect_head, not_before_ms
        raise AppendFailedError("injected: the disk went away")


def test_a_failed_append_hands_out_no_grant(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    del root
    failing = FailingJournal.open(journal.location.display)
    svc = SpawnService(failing, keystore=keystore, policy=FixedPolicy(Verdict.POSITIVE))
    caller = svc.durable_caller("root")
    head = journal.head()
    with pytest.raises(AppendFailedError):
        svc.spawn(caller, intent(10))
    assert journal.head() == head


def test_a_database_that_refuses_the_mints_commits_nothing_not_even_the_gate(
    journal: Journal, keystore: KeyStore, root: AgentRecord, tmp_path: Path
) -> None:
    """A real SQLite trigger aborts the insert of the first GrantMinted row: the gate
    decision already inserted in the same transaction must roll back with it."""
    del root
    svc = SpawnService(journal, keystore=keystore, policy=FixedPolicy(Verdict.POSITIVE))
    caller = svc.durable_caller("root")
    db = sqlite3.connect(tmp_path / "journal.db")
    db.execute(
        "CREATE TRIGGER refuse_mints BEFORE INSERT ON stored_events "
        "WHEN NEW.topic LIKE 'GrantMinted/%' BEGIN SELECT RAISE(ABORT, 'injected'); END"
    )
    db.commit()
    head = journal.head()
    result = None
    with pytest.raises(AppendFailedError):
        result = svc.spawn(caller, intent(10))
    assert result is None
    assert journal.head() == head
    assert list(journal.entries(types=("GateDecided",))) == []
    db.execute("DROP TRIGGER refuse_mints")
    db.commit()
    db.close()
    # Positive control: the same spawn now commits, numbered from sa-1 (nothing leaked).
    again = svc.spawn(caller, intent(10))
    assert str(again.children[0].lineage) == "agent:root/sa-1"


def test_concurrent_services_never_mint_the_same_lineage(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    del root
    one = SpawnService(journal, keystore=keystore, policy=FixedPolicy(Verdict.POSITIVE))
    other_journal = Journal.open(journal.location.display)
    two = SpawnService(other_journal, keystore=keystore, policy=FixedPolicy(Verdict.POSITIVE))
    a, b = one.durable_caller("root"), two.durable_caller("root")
    results = [one.spawn(a, intent(3)), two.spawn(b, intent(3)), one.spawn(a, intent(3))]
    lineages = [str(c.lineage) for r in results for c in r.children]
    assert len(set(lineages)) == 9
    assert lineages[-1] == "agent:root/sa-9"
    other_journal.close()


def test_a_decision_on_stale_state_is_caught_by_the_pinned_append(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    """Decide on a view, let another writer spawn, then append: the pin refuses it."""
    del root
    svc = SpawnService(journal, keystore=keystore, policy=FixedPolicy(Verdict.POSITIVE))
    caller = svc.durable_caller("root")
    seed = bytes(caller.custody_key)
    state = ParentState(
        caller.chain[0], seed, minted=0, reserved=0, version=journal.stream_version("agent:root")
    )
    stale = decide(state, FanoutCommand("f", intent(2), svc.clock()), policy=svc.policy)
    svc.spawn(caller, intent(2))  # another fan-out lands first
    with pytest.raises(AppendConflictError):
        journal.append(stale.events, expect=stale.expect)
