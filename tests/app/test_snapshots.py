"""Snapshots of the views: a new process starts from the snapshot a process saved and
catches up from its position, so a one-shot spawn does not fold the journal from its
start; a snapshot that does not match the journal is ignored (the views fold from zero)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import LEASE_EVENTS, FabricCeilings, LeaseBook, LeaseGranted
from charter.control import Ceiling
from charter.core import Budget, KeyStore, now_ms
from charter.core.clock import entry_ms
from charter.ledger import _snapshot as stored

PLENTY = Budget.parse("tokens=1000M,wall=100000h,cpu=100000h,mem=1000GiB,egress=1000GB")
UNBOUNDED = Settings(ceilings=FabricCeilings(population=10**9))
FIVE = SpawnIntent(
    width=5,
    objective="review each module of the package for risky calls",
    estimated_cost=Budget.parse("tokens=10k,wall=1h,cpu=1h,mem=256MiB,egress=0"),
)


def _charter(url: str, home: Path) -> Charter:
    made, _ = Charter.initialise(
        url,
        root="estate",
        ceiling=Ceiling(budget=PLENTY, depth=4, fanout=10_000),
        cell=CellSetup(cores=2),
        keys=KeyStore(home),
        settings=UNBOUNDED,
    )
    made.add_agent("other", Ceiling(budget=PLENTY, depth=2, fanout=1_000_000))
    return made


def _unrelated(charter: Charter, fanouts: int, width: int, wall: str = "s") -> None:
    """``fanouts`` fan-outs of ``width`` under root ``other``: each child's lease lasts
    one ``wall`` (a second, or an hour to keep them live through a test)."""
    cost = f"tokens={width},wall={width}{wall},cpu={width}s,mem=0,egress=0"
    intent = SpawnIntent(
        width=width, objective="someone else's fan-out", estimated_cost=Budget.parse(cost)
    )
    for _ in range(fanouts):
        charter.spawn("agent:other", intent, policy=FixedPolicy(Verdict.POSITIVE))


def _one_shot(url: str, home: Path, ceiling: int = 10**9) -> dict[str, Any]:
    """A width-5 spawn in a fresh process: its outcome, the rows it read at the store,
    the snapshot position it started from (0: folded from zero), the head."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.app._one_shot", url, str(home), str(ceiling)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return dict(json.loads(done.stdout))


def _short_history(url: str, home: Path) -> dict[str, Any]:
    """A journal with one width-5 spawn and its snapshot saved; a one-shot spawn on it."""
    with _charter(url, home) as charter:
        charter.spawn("agent:estate", FIVE, policy=FixedPolicy(Verdict.POSITIVE))
        assert charter.views.save(every=1)
    fresh = _one_shot(url, home)
    assert fresh["outcome"] == "ok"
    assert fresh["from"] > 0
    return fresh


def _snapshot_file(home: Path) -> Path:
    (path,) = (home / "views").glob("views-*.snapshot")
    return path


@pytest.mark.slow
def test_a_one_shot_spawn_reads_rows_independent_of_the_journals_history(
    journal_url: str, tmp_path: Path
) -> None:
    """A fresh process spawning after 100,000 entries of unrelated fan-outs reads as many
    rows as one on a short journal: it starts from the snapshot the long-lived process
    saved when it closed. The control (no snapshot) folds from zero and fails the bound."""
    home = tmp_path / "home"
    fresh = _short_history(journal_url, home)
    with Charter.open(journal_url, keys=KeyStore(home), settings=UNBOUNDED) as charter:
        _unrelated(charter, fanouts=100, width=1000)  # 100,000 entries of history
    after = _one_shot(journal_url, home)
    assert after["head"] > 100_000
    assert after["outcome"] == "ok"
    assert after["from"] > 100_000  # started from the snapshot saved at close
    assert after["rows"] <= fresh["rows"] + 2, (after, fresh)
    # The control: without the snapshot the same spawn folds the whole history.
    _snapshot_file(home).unlink()
    control = _one_shot(journal_url, home)
    assert control["outcome"] == "ok"
    assert control["from"] == 0
    assert control["rows"] > after["head"] - 20 > fresh["rows"] + 2


@pytest.mark.slow
def test_a_one_shot_start_holds_leases_independent_of_how_many_ended(
    journal_url: str, tmp_path: Path
) -> None:
    """A fresh process after 20,000 ended leases holds what one after a short history
    holds, and reads as many rows: ended leases left the views before the snapshot was
    saved (only the live ones, and each parent's settled sums, are in it). The
    control, the lease book that keeps every lease, folded from the same journal,
    holds all 20,000."""
    home = tmp_path / "home"
    fresh = _short_history(journal_url, home)
    with Charter.open(journal_url, keys=KeyStore(home), settings=UNBOUNDED) as charter:
        _unrelated(charter, fanouts=20, width=1000)  # one-second leases
        last = max(
            e.event.expires_at_ms
            for e in charter.journal.entries(types=("LeaseGranted",))
            if isinstance(e.event, LeaseGranted) and e.event.parent == "agent:other"
        )
        while now_ms() <= last:  # until every one of them has expired (by the clock)
            time.sleep(0.05)
        # One commit after their end: from it on, nothing can change them.
        charter.spawn("agent:estate", FIVE, policy=FixedPolicy(Verdict.POSITIVE))
    after = _one_shot(journal_url, home)
    assert after["outcome"] == "ok"
    assert after["from"] > 20_000
    assert after["rows"] <= fresh["rows"] + 2, (after, fresh)
    # Ten more live leases under estate (the spawn above and this one-shot's own), and
    # nothing of the 20,000 that ended.
    assert after["ledgers"] == fresh["ledgers"] + 10, (after, fresh)
    assert after["population"] <= fresh["population"] + 10, (after, fresh)
    assert after["queued"] <= fresh["queued"] + 60, (after, fresh)
    # The control: the book that keeps every lease ever granted.
    kept = LeaseBook()
    with Charter.open(journal_url, keys=KeyStore(home), settings=UNBOUNDED) as charter:
        for entry in charter.journal.entries(types=tuple(c.type_name for c in LEASE_EVENTS)):
            kept.apply(entry.event, entry_ms(entry.recorded_at))
    assert sum(1 for _ in kept.ledgers()) > 20_000 > fresh["ledgers"] + 10


def _rewritten(
    data: bytes,
    *,
    position: int | None = None,
    chain: bytes | None = None,
    version: bytes | None = None,
    body: bytes | None = None,
    journal: bytes | None = None,
    digest: bool = True,
) -> bytes:
    """``data`` (a snapshot file) with header fields or its body replaced; its digest
    recomputed unless ``digest=False``."""
    start = len(stored._MAGIC)
    end = start + stored._HEADER.size
    old_position, old_chain, old_version, old_journal, _ = stored._HEADER.unpack(data[start:end])
    old_digest, old_body = data[end : end + stored._DIGEST], data[end + stored._DIGEST :]
    new_body = old_body if body is None else body
    header = stored._HEADER.pack(
        old_position if position is None else position,
        old_chain if chain is None else chain,
        old_version if version is None else stored._digest(version),
        old_journal if journal is None else journal,
        len(new_body),
    )
    mark = stored._digest(stored._MAGIC + header + new_body) if digest else old_digest
    return stored._MAGIC + header + mark + new_body


def _chain(data: bytes) -> bytes:
    """The chain hash a snapshot file recorded (of the entry at its position)."""
    start = len(stored._MAGIC)
    return bytes(stored._HEADER.unpack(data[start : start + stored._HEADER.size])[1])


def _body(data: bytes) -> bytes:
    return data[len(stored._MAGIC) + stored._HEADER.size + stored._DIGEST :]


def test_a_snapshot_that_does_not_match_the_journal_is_ignored(
    journal_url: str, tmp_path: Path
) -> None:
    """The attack: a stale snapshot (600 live workers) relabelled as covering the head
    (610 live, at a population ceiling of 610), so a fresh process would let 5 more in.
    Each check refuses it on its own (the hash at its position, the positions in its
    body, its digest, version, body and journal), the process folds from zero, and the
    spawn is refused as it must be."""
    home = tmp_path / "home"
    with _charter(journal_url, home) as charter:
        _unrelated(charter, fanouts=1, width=600, wall="h")
        assert charter.views.save(every=1)
        stale = _snapshot_file(home).read_bytes()
        stale_position = charter.views.snapshot_position
        for _ in range(2):
            charter.spawn("agent:estate", FIVE, policy=FixedPolicy(Verdict.POSITIVE))
        head = charter.journal.head()
    assert head is not None
    path = _snapshot_file(home)
    relabelled = _rewritten(stale, position=head[0], chain=head[1])
    layout, budgets, states = json.loads(_body(stale))
    for state in states:  # each view's own position, its first attribute
        state[0] = head[0]
    forged = _rewritten(relabelled, body=json.dumps([layout, budgets, states]).encode())
    tampered = {
        "the positions its views are at": relabelled,
        "the hash at its position": _rewritten(forged, chain=_chain(stale)),
        "its digest": _rewritten(
            stale, position=head[0], chain=head[1], body=_body(forged), digest=False
        ),
        "its version": _rewritten(forged, version=b"another build of charter"),
        "its body": _rewritten(forged, body=b'[{"not": "views"}]'),
        "its journal": _rewritten(forged, journal=bytes(32)),
    }
    for what, data in tampered.items():
        path.write_bytes(data)
        run = _one_shot(journal_url, home, ceiling=610)
        assert (what, run["from"], run["outcome"]) == (what, 0, "population-ceiling")
        assert run["rows"] >= head[0], (what, run)
    # The controls. The stale snapshot as it was (valid for its own position): used,
    # caught up from there, and the decision is the same.
    path.write_bytes(stale)
    run = _one_shot(journal_url, home, ceiling=610)
    assert (run["from"], run["outcome"]) == (stale_position, "population-ceiling")
    assert run["rows"] < head[0] - stale_position + 20
    # Forged with every check satisfied (what only someone who can write the Charter
    # home, and so take its custody keys, can do): trusted, and the decision is wrong.
    # This is what the checks above stop.
    path.write_bytes(forged)
    run = _one_shot(journal_url, home, ceiling=610)
    assert (run["from"], run["outcome"]) == (head[0], "ok")


def test_views_from_a_snapshot_decide_as_views_folded_from_zero(
    journal_url: str, tmp_path: Path
) -> None:
    """Rebuild == incremental: views loaded from a snapshot and caught up answer every
    question the decisions ask as views folded from the journal's start do."""
    home = tmp_path / "home"
    with _charter(journal_url, home) as charter:
        _unrelated(charter, fanouts=2, width=300)
        charter.spawn("agent:estate", FIVE, policy=FixedPolicy(Verdict.POSITIVE))
        charter.revoke("agent:other/sa-7")
        assert charter.views.save(every=1)
        _unrelated(charter, fanouts=1, width=50)
        charter.spawn("agent:estate", FIVE, policy=FixedPolicy(Verdict.POSITIVE))
    loaded = Charter.open(journal_url, keys=KeyStore(home), settings=UNBOUNDED)
    folded = Charter(loaded.journal, KeyStore(tmp_path / "elsewhere"), UNBOUNDED)
    with loaded:
        for charter in (loaded, folded):
            charter.views.refresh(charter.journal)
        assert 0 < loaded.views.snapshot_position < loaded.views.position
        assert folded.views.snapshot_position == 0
        a, b = loaded.views, folded.views
        assert a.position == b.position
        at = max(a.resources.settled_ms, b.resources.settled_ms) + 1
        for name in ("agents", "digests", "minted", "reserved", "revoked"):
            assert getattr(a.authority, name) == getattr(b.authority, name), name
        lineages = [ledger.lineage for ledger in b.resources.book.ledgers()]
        assert len(lineages) > 600
        for lineage in lineages:
            assert a.resources.book.remaining(lineage, at) == b.resources.book.remaining(
                lineage, at
            ), lineage
        assert a.resources.population.live(at) == b.resources.population.live(at) > 0
        assert {n: (c.caps, c.holders, c.queued) for n, c in a.resources.cells.cells().items()} == {
            n: (c.caps, c.holders, c.queued) for n, c in b.resources.cells.cells().items()
        }
