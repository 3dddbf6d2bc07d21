"""A COMMIT whose acknowledgement is lost, followed by an outage (a real TCP proxy
between the journal and PostgreSQL drops the reply and then every connection): the
append returns the committed positions, or raises OutcomeUnknownError naming the batch,
never a plain failure; a retried spawn of the same request does not mint twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, GrantMinted, SpawnIntent, Verdict
from charter.control import Ceiling
from charter.core import Budget, KeyStore
from charter.ledger import BatchCommittedError, Journal, JournalCreated, OutcomeUnknownError
from tests.invariants import check_history, journal_history
from tests.journal._proxy import CommitCuttingProxy
from tests.journal._support import Ping

pytestmark = pytest.mark.postgres

BUDGET = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB")
COST = Budget.parse("tokens=10k,wall=1m,cpu=1m,mem=64MiB,egress=1MB")


@pytest.fixture
def proxied(pg_url: str) -> Iterator[tuple[str, CommitCuttingProxy]]:
    u = urlparse(pg_url)
    with CommitCuttingProxy((u.hostname or "127.0.0.1", u.port or 5432)) as proxy:
        yield pg_url, proxy


def _pings(journal: Journal, writer: str) -> list[int]:
    return [e.position for e in journal.entries() if getattr(e.event, "writer", None) == writer]


def test_lost_ack_then_a_short_outage_gives_the_committed_positions(
    proxied: tuple[str, CommitCuttingProxy],
) -> None:
    direct, proxy = proxied
    Journal.create(direct).close()
    dbname = urlparse(direct).path.lstrip("/")
    with Journal.open(proxy.url(dbname)) as journal:
        journal.append([Ping(writer="warm", batch=0, n=0)])  # the proxy forwards
        proxy.cut_next_commit(outage=1.0)
        committed = journal.append(Ping(writer="w", batch=1, n=i) for i in range(3))
    assert proxy.cuts == 1  # the acknowledgement of that COMMIT really was lost
    with Journal.open(direct) as journal:
        assert _pings(journal, "w") == [c.position for c in committed]  # once, where it said
        assert [e.position for e in journal.batch_entries(committed[0].batch)] == [
            c.position for c in committed
        ]


def test_an_outage_past_the_wait_is_outcome_unknown_naming_the_batch(
    proxied: tuple[str, CommitCuttingProxy],
) -> None:
    direct, proxy = proxied
    Journal.create(direct).close()
    dbname = urlparse(direct).path.lstrip("/")
    with Journal.open(proxy.url(dbname)) as journal:
        journal.append([Ping(writer="warm", batch=0, n=0)])
        journal.settle_wait_s = 0.5
        proxy.cut_next_commit(outage=3.0)
        with pytest.raises(OutcomeUnknownError) as caught:
            journal.append(Ping(writer="w", batch=1, n=i) for i in range(3))
    assert proxy.cuts == 1
    batch = caught.value.batch
    assert batch in str(caught.value)
    with Journal.open(direct) as journal:
        # Positive control: it did commit although the writer never heard so, which is
        # why a plain "append failed, nothing written" would have been a lie.
        landed = [e.position for e in journal.batch_entries(batch)]
        assert landed == _pings(journal, "w")
        assert len(landed) == 3
        # Retrying with the same batch id writes nothing and answers where it landed.
        again = journal.append((Ping(writer="w", batch=1, n=i) for i in range(3)), batch=batch)
        assert [c.position for c in again] == landed
        assert _pings(journal, "w") == landed


def _minted(journal: Journal) -> list[str]:
    return [e.event.fanout for e in journal.entries() if isinstance(e.event, GrantMinted)]


def test_a_retried_spawn_after_outcome_unknown_does_not_mint_twice(
    proxied: tuple[str, CommitCuttingProxy], tmp_path: Path
) -> None:
    direct, proxy = proxied
    keys = KeyStore(tmp_path / "home")
    charter, _ = Charter.initialise(
        direct,
        root="estate",
        ceiling=Ceiling(budget=BUDGET),
        cell=CellSetup(cores=8, reserve=0),
        keys=keys,
        settings=Settings(),
    )
    charter.close()
    intent = SpawnIntent(width=3, objective="scan the estate host by host", estimated_cost=COST)
    policy = FixedPolicy(Verdict.POSITIVE)
    dbname = urlparse(direct).path.lstrip("/")
    with Charter.open(proxy.url(dbname), keys=keys, settings=Settings()) as charter:
        charter.journal.settle_wait_s = 0.5
        charter.agents()  # warm: the pool's connection is up
        proxy.cut_next_commit(outage=3.0)
        with pytest.raises(OutcomeUnknownError) as caught:
            charter.spawn("agent:estate", intent, policy=policy, request_id="req42")
    assert caught.value.batch == "req42"
    with Charter.open(direct, keys=keys, settings=Settings()) as charter:
        with pytest.raises(BatchCommittedError) as again:
            charter.spawn("agent:estate", intent, policy=policy, request_id="req42")
        assert again.value.batch == "req42"
        fanouts = [f for f in _minted(charter.journal) if f == "req42"]
        assert len(fanouts) == 3  # minted once, by the first try
        # Positive control: a retry without the request id would have minted again.
        charter.spawn("agent:estate", intent, policy=policy)
        assert len([f for f in _minted(charter.journal) if f != "req42"]) == 3 + 1  # + root
        findings = check_history(journal_history(charter.journal))
        assert findings.problems == []
        assert findings.checked > 0


def test_journal_show_batch_lists_only_that_append(tmp_path: Path) -> None:
    from tests.journal.test_cli import charter

    url = f"sqlite:///{tmp_path / 'j.db'}"
    Journal.create(url).close()
    with Journal.open(url) as journal:  # an event type the CLI knows

        def fact(n: int) -> JournalCreated:
            return JournalCreated(journal_key=f"k{n}", created_at="2026-11-30")

        journal.append([fact(0)])
        mine = journal.append([fact(1), fact(2)], batch="abc123")
        journal.append([fact(3)])
    home = tmp_path / "home"
    shown = charter("--db", url, "--json", "journal", "show", "--batch", "abc123", home=home)
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [line["position"] for line in lines] == [c.position for c in mine]
    assert {line["batch"] for line in lines} == {"abc123"}
    none = charter("--db", url, "--json", "journal", "show", "--batch", "nothere", home=home)
    assert none.returncode == 0
    assert none.stdout == ""  # that batch did not commit
