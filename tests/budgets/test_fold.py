"""The independent fold (tests/invariants.py) itself: its lease-bound checks find what
they are for (positive controls), and its running sums give exactly what the
child-by-child walk gives, on random histories that break the rules as often as not."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.invariants import AXES, check_history

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MS0 = int(T0.timestamp() * 1000)
History = list[tuple[int, str, dict[str, Any], datetime]]


def _vec(n: int) -> dict[str, int]:
    return dict.fromkeys(AXES, n)


def _grant(lineage: str, expires: int) -> dict[str, Any]:
    body = json.dumps({"lineage": lineage, "terms": {"expires_at_ms": expires}})
    return {"lineage": lineage, "issuer": "r", "fanout": "f", "body": body, "signature": ""}


def _at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def test_the_fold_finds_leases_past_their_grants_and_parents() -> None:
    """A lease granted past its grant's expiry, a renewal past its parent's lease and
    past its grant, a renewal and a grant after the end: each reported at its position."""
    history: History = [
        (1, "BudgetLedgerOpened", {"lineage": "r", "allocation": _vec(100)}, _at(0)),
        (2, "GrantMinted", _grant("a", MS0 + 1000), _at(0)),
        (3, "LeaseGranted", {"parent": "r", "lineages": ["a"], "allocation": _vec(10),
                             "expires_at_ms": MS0 + 2000}, _at(0)),
        (4, "GrantMinted", _grant("a/b", MS0 + 10_000), _at(1)),
        (5, "LeaseGranted", {"parent": "a", "lineages": ["a/b"], "allocation": _vec(1),
                             "expires_at_ms": MS0 + 500}, _at(1)),
        (6, "LeaseRenewed", {"lineage": "a/b", "parent": "a",
                             "expires_at_ms": MS0 + 3000}, _at(2)),
        (7, "LeaseRenewed", {"lineage": "a/b", "parent": "a",
                             "expires_at_ms": MS0 + 4000}, _at(3500)),
        (8, "LeaseGranted", {"parent": "a", "lineages": ["a/c"], "allocation": _vec(1),
                             "expires_at_ms": MS0 + 1900}, _at(2500)),
    ]  # fmt: skip
    problems = check_history(history).problems
    assert any(p.startswith("3: a's lease ends") and "after its grant" in p for p in problems)
    assert any(p.startswith("6: a/b's lease ends") and "after its parent" in p for p in problems)
    assert not any(p.startswith("6:") and "grant" in p for p in problems)  # 3000 < 10000
    assert any(p.startswith("7: renewal of a/b after the end of a/b") for p in problems)
    assert any(p.startswith("8: lease granted by a after the end of a") for p in problems)
    within = dict(history[2][2], expires_at_ms=MS0 + 1000)  # a within its grant
    assert check_history([*history[:2], (3, "LeaseGranted", within, _at(0)), *history[3:5]]) \
        .problems == []  # fmt: skip


def _random_history(rng: random.Random, length: int) -> History:
    """Grants, usages (often past what is left), releases and renewals (sometimes
    shortening, sometimes late), at times that mostly move on and sometimes go back."""
    opened = {"lineage": "r", "allocation": _vec(1000)}
    history: History = [(1, "BudgetLedgerOpened", opened, _at(0))]
    live = ["r"]
    t = 0
    for position in range(2, length + 2):
        t = max(0, t + rng.choice([0, 1, 5, 20, 50, -3]))
        parent = rng.choice(live)
        op = rng.random()
        if op < 0.35 or len(live) == 1:
            names = [f"{parent}/{position}.{i}" for i in range(rng.randint(1, 3))]
            payload = {"parent": parent, "lineages": names, "allocation": _vec(rng.randint(1, 300)),
                       "expires_at_ms": MS0 + t + rng.randint(1, 200)}  # fmt: skip
            history.append((position, "LeaseGranted", payload, _at(t)))
            live.extend(names)
        elif op < 0.7:
            amount = _vec(rng.randint(0, 400))
            history.append((position, "UsageRecorded", {"lineage": parent, "amount": amount},
                            _at(t)))  # fmt: skip
        elif op < 0.85 and parent != "r":
            history.append((position, "LeaseReleased", {"lineage": parent}, _at(t)))
        elif parent != "r":
            up = parent.rsplit("/", 1)[0]
            payload = {"lineage": parent, "parent": up,
                       "expires_at_ms": MS0 + t + rng.randint(-50, 300)}  # fmt: skip
            history.append((position, "LeaseRenewed", payload, _at(t)))
    return history


def test_the_running_sums_equal_the_walk_on_random_histories() -> None:
    problems = 0
    for seed in range(300):
        history = _random_history(random.Random(seed), 120)
        sums, walk = check_history(history), check_history(history, walk=True)
        assert sums == walk, seed
        problems += len(sums.problems)
    assert problems > 300  # the histories do break the rules (the comparison has teeth)
