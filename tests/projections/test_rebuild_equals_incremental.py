"""Rebuild from zero == incremental == the ledger's pure folds, as of every position,
on real SQLite and real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from charter.budgets import Cells, LeaseBook
from charter.ledger import Journal
from charter.projections import PositionBeyondHeadError, Projector
from tests.projections.history import History, ms_of


def _expected(book: LeaseBook, cells: Cells, at_ms: int) -> tuple[Any, Any]:
    budgets = {}
    for ledger in book.ledgers():
        budgets[ledger.lineage] = (
            book.remaining(ledger.lineage, at_ms),
            ledger.spent,
            ledger.subtree_spent,
            ledger.active(at_ms),
            ledger.exhausted,
        )
    slots = {
        name: {str(r): sorted(h) for r, h in state.holders.items() if h}
        for name, state in cells.cells().items()
    }
    return budgets, slots


def _answers(projector: Projector, position: int) -> tuple[Any, Any]:
    report = projector.budgets(as_of=position)
    budgets = {
        line.lineage: (
            line.remaining,
            line.spent,
            line.subtree_spent,
            line.status == "active",
            line.exhausted,
        )
        for line in report.ledgers
    }
    slots = {
        cell.cell: {r: list(h) for r, h in cell.holders.items() if h}
        for cell in projector.slots(as_of=position).cells
    }
    return budgets, slots


@pytest.mark.parametrize("seed", [7, 1234])
def test_rebuild_equals_incremental_at_every_position(journal_url: str, seed: int) -> None:
    Journal.create(journal_url).close()
    with Journal.open(journal_url) as journal:
        batched = Projector(journal, "inc")
        stepped = Projector(journal, "step")
        # The incremental copy catches up after every commit; the stepped copy one
        # position at a time (so a transaction boundary falls at every position).
        for batch in History(seed).batches(80):
            journal.append(batch)
            batched.catch_up()
        head = journal.head()
        assert head is not None
        positions = [row.position for row in journal.rows()]
        for p in positions:
            assert stepped.catch_up(stop=p) == p
        rebuilt = Projector(journal, "reb")
        assert rebuilt.rebuild() == head[0]

        book, cells = LeaseBook(), Cells()
        nodes: set[str] = set()
        checked = 0
        for entry in journal.entries():
            at_ms = ms_of(entry.recorded_at)
            book.apply(entry.event, at_ms)
            cells.apply(entry.event)
            payload = entry.event.payload()
            if entry.type_name == "AgentRegistered" or (
                entry.type_name == "GrantMinted" and payload["lineage"] != payload["issuer"]
            ):
                nodes.add(payload["lineage"])
            p = entry.position
            want = _expected(book, cells, at_ms)
            for projector in (batched, stepped, rebuilt):
                assert projector.at_ms(p) == at_ms
                assert _answers(projector, p) == want, (projector.tracking_name, p)
                tree = projector.tree(as_of=p)
                assert {n.lineage for n in tree.nodes} == nodes
            checked += 1
        assert checked == len(positions) > 150
        # Positive control: a different position gives a different answer somewhere.
        assert _answers(rebuilt, positions[-1]) != _answers(rebuilt, positions[10])
        # Time matters: some leases have expired (charged only what they spent).
        assert any(line.status == "expired" for line in rebuilt.budgets().ledgers)
        counts = rebuilt.counts()
        assert counts == batched.counts() == stepped.counts()
        assert sum(counts.values()) == len(positions)
        for projector in (batched, stepped, rebuilt):
            projector.close()


def test_subtree_and_as_of_limits(journal_url: str) -> None:
    Journal.create(journal_url).close()
    with Journal.open(journal_url) as journal, Projector(journal) as projector:
        for batch in History(3, roots=1).batches(40):
            journal.append(batch)
        head = projector.catch_up()
        everything = projector.budgets()
        child = next(line for line in everything.ledgers if line.lineage.count("/") == 1)
        sub = projector.budgets(child.lineage)
        assert {line.lineage for line in sub.ledgers} == {
            line.lineage
            for line in everything.ledgers
            if line.lineage == child.lineage or line.lineage.startswith(child.lineage + "/")
        }
        # The subtree answer for a node is the same as in the whole answer.
        assert sub.get(child.lineage) == child
        tree = projector.tree(child.lineage)
        assert all(n.lineage.startswith(child.lineage) for n in tree.nodes)
        assert projector.budgets(as_of=0).ledgers == ()
        with pytest.raises(PositionBeyondHeadError):
            projector.budgets(as_of=head + 1)
        with pytest.raises(PositionBeyondHeadError):
            projector.slots(as_of=-1)
