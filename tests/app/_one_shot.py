"""A one-shot spawn in a fresh process (run by tests/app/test_snapshots.py): open the
journal, spawn width 5 under agent:estate, close; print what it read at the store.

    python3 -m tests.app._one_shot URL HOME POPULATION_CEILING
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from charter.app import Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import FabricCeilings
from charter.core import Budget, CharterError, KeyStore


def main() -> None:
    url, home, ceiling = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    settings = Settings(ceilings=FabricCeilings(population=ceiling))
    rows = 0
    with Charter.open(url, keys=KeyStore(home), settings=settings) as charter:
        store = charter.journal._store

        def counted(read: Any) -> Any:
            def reading(*args: Any, **kwargs: Any) -> Iterator[list[Any]]:
                nonlocal rows
                for batch in read(*args, **kwargs):
                    rows += len(batch)
                    yield batch

            return reading

        def one(read: Any) -> Any:
            def reading(*args: Any, **kwargs: Any) -> Any:
                nonlocal rows
                rows += 1
                return read(*args, **kwargs)

            return reading

        store.payloads = counted(store.payloads)
        store.batches = counted(store.batches)
        store.predecessor = one(store.predecessor)
        intent = SpawnIntent(
            width=5,
            objective="review each module of the package for risky calls",
            estimated_cost=Budget.parse("tokens=10k,wall=1h,cpu=1h,mem=256MiB,egress=0"),
        )
        try:
            charter.spawn("agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE))
            outcome = "ok"
        except CharterError as e:
            outcome = str(getattr(e, "reason", type(e).__name__))
        started = charter.views.snapshot_position
        head = charter.journal.head()
        held = _held(charter)
    seen = {"rows": rows, "outcome": outcome, "from": started, "head": head[0] if head else 0}
    seen |= held
    print(json.dumps(seen))


def _held(charter: Charter) -> dict[str, int]:
    """What the resource view holds: its ledgers, the live population's entries, and
    the entries of its heaps and queues (each grows with the leases it keeps)."""
    resources = charter.views.resources
    book, population = resources.book, resources.population
    ledgers = list(book.ledgers())
    return {
        "ledgers": len(ledgers),
        "population": sum(map(len, (population._released, population._children, population._open))),
        "queued": len(book._ends)
        + len(population._expiries)
        + sum(len(x.expiries) + len(x.expired) + len(x.children) for x in ledgers),
    }


if __name__ == "__main__":
    main()
