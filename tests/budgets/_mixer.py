"""One of the mixed-load workers: until its deadline, at random (seeded), fan out from
the root or from a worker it spawned, record usage on one of its workers (sometimes more
than it holds), release one, renew one, or idle a moment so short leases expire.

Refusals and lost races (every ``CharterError``) are expected outcomes and are counted;
anything else crashes the process. Prints one JSON line of counts at the end.

Run as ``python -m tests.budgets._mixer URL HOME SECONDS SEED`` from the repository root.
With ``CHARTER_HOLD_KINDS`` set, the journal's recorder holds some commits open after
their stamp (tests/budgets/_slow.py: the commit window, injected). For bench/mixed.py:
``CHARTER_MIXER_UNPACED=1`` drops the pause between operations (as fast as it goes), and
``CHARTER_MIXER_NO_SETTLED_TIME=1`` takes every expiry as final at once (the settled-time
rule switched off, test-side, to measure what it costs).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from charter.budgets import LeaseBook
from charter.control import BudgetService, Caller
from charter.core import Budget, CharterError, KeyStore, RefusedError, now_ms
from charter.ledger import Journal
from tests.budgets import _slow
from tests.budgets._support import intent, service

LIFETIME_MS = (1_000, 4_000)  # a lease's wall-clock allocation is its lifetime
PAUSE_S = (0.002, 0.01)  # between operations, so 16 processes on 2 cores interleave
# An operation starts at most this often (s): bounds the history on a fast machine, since
# the independent fold's cost grows with the square of the root's children.
PERIOD_S = (0.1, 0.25)
EDGE_MS = 150  # a usage or renewal may wait this long for a lease's last moments
STALE_MS = 500  # a worker is still tried this long after its lease ended (refusals)
OPERATIONS = ("fanout", "usage", "release", "renew", "idle")
WEIGHTS = (30, 35, 10, 12, 13)


@dataclass
class Worker:
    caller: Caller
    lease_end_ms: int = 0  # as last renewed by this process (its grant's end before)

    def __post_init__(self) -> None:
        self.lease_end_ms = max(self.lease_end_ms, self.grant_end_ms)

    @property
    def lineage(self) -> str:
        return self.caller.claimed

    @property
    def grant_end_ms(self) -> int:
        return self.caller.chain[-1].grant.terms.expires_at_ms


def scaled(budget: Budget, fraction: float) -> Budget:
    return Budget(**{a: int(getattr(budget, a) * fraction) for a in Budget.AXES})


class Mixer:
    def __init__(self, journal: Journal, home: Path, rng: random.Random) -> None:
        self.rng = rng
        self.svc = service(journal, KeyStore(home))
        self.budgets = BudgetService(journal)
        self.root = self.svc.durable_caller("root")
        self.workers: list[Worker] = []
        self.tally: Counter[str] = Counter(
            spawns=0,
            children=0,
            usages=0,
            usages_over=0,
            releases=0,
            renewals=0,
            renewals_committed=0,
            refused=0,
            refusals=0,
            at_the_edge=0,
        )
        self.errors: Counter[str] = Counter()

    def step(self) -> None:
        self.prune()
        op = self.rng.choices(OPERATIONS, WEIGHTS)[0]
        if op != "fanout" and not self.workers:
            op = "fanout"
        try:
            getattr(self, op)()
        except CharterError as error:  # refused, or lost a race: an expected outcome
            self.tally["refused"] += 1  # every CharterError; "refusals": RefusedError only
            self.tally["refusals"] += isinstance(error, RefusedError)
            self.errors[f"{op}:{type(error).__name__}"] += 1

    def prune(self) -> None:
        """Forget workers whose lease ended a while ago (they are still tried for a
        moment after it ends: those attempts are refused)."""
        now = now_ms()
        self.workers = [w for w in self.workers if w.lease_end_ms + STALE_MS > now]

    def pick(self, workers: list[Worker] | None = None) -> Worker:
        return self.rng.choice(self.workers if workers is None else workers)

    def pick_at_the_edge(self) -> Worker:
        """Half the time, a worker whose lease ends within EDGE_MS, once it is within
        a few ms of the end: the decision sees it live, the commit may come too late
        (then the journal's deadline must refuse it). Otherwise any worker."""
        now = now_ms()
        ending = [w for w in self.workers if 0 < w.lease_end_ms - now <= EDGE_MS]
        if not ending or self.rng.random() < 0.5:
            return self.pick()
        worker = self.pick(ending)
        time.sleep(max(0.0, worker.lease_end_ms - now - self.rng.uniform(0, 15)) / 1000)
        self.tally["at_the_edge"] += 1
        return worker

    # -- the operations -----------------------------------------------------------

    def fanout(self) -> None:
        rng = self.rng
        now = now_ms()
        # A worker spawns under its grant, which a renewal of its lease does not extend.
        spawners = [w for w in self.workers if w.grant_end_ms > now]
        if not spawners or rng.random() < 0.5:  # the root: a sliver of its budget
            caller, fraction = self.root, rng.uniform(0.001, 0.02)
            width, allowance = rng.randint(1, 3), 6
        else:  # a worker: a good part of what it holds
            caller, fraction = self.pick(spawners).caller, rng.uniform(0.1, 0.9)
            width, allowance = rng.randint(1, 2), 2
        held = self.budgets.remaining(caller.claimed)
        cost = scaled(held, fraction)
        lifetime = rng.randint(*LIFETIME_MS)
        wall = min(width * lifetime, int(held.wall_ms * fraction))
        cost = cost.model_copy(update={"wall_ms": max(wall, width)})
        result = self.svc.spawn(caller, intent(width, cost, fanout=allowance))
        self.tally["spawns"] += 1
        self.tally["children"] += len(result.children)
        self.workers.extend(Worker(caller.child(minted)) for minted in result.children)

    def usage(self) -> None:
        worker = self.pick_at_the_edge()
        held = self.budgets.remaining(worker.lineage)
        over = self.rng.random() < 0.15
        fraction = self.rng.uniform(1.0, 2.0) if over else self.rng.uniform(0.02, 0.5)
        amount = scaled(held, fraction)
        if amount == Budget.zero():  # ended or spent: still try, a little
            amount = Budget.parse("tokens=1,wall=1ms,cpu=1ms,mem=0,egress=0")
        self.budgets.record_usage(worker.lineage, amount)
        self.tally["usages"] += 1
        self.tally["usages_over"] += over

    def release(self) -> None:
        worker = self.pick()
        self.budgets.release(worker.lineage)
        self.tally["releases"] += 1
        gone = worker.lineage
        self.workers = [
            w for w in self.workers if w.lineage != gone and not w.lineage.startswith(gone + "/")
        ]

    def renew(self) -> None:
        """Try to extend a worker's lease a little past where it ends now (as the journal
        says): refused if it or an ancestor has ended, if it would outlive its parent's,
        or (always, for a spawned lease, which ends with its grant) its grant's.
        ``renewals`` counts the attempts, ``renewals_committed`` those that committed."""
        worker = self.pick_at_the_edge()
        self.budgets.remaining(worker.lineage)  # brings the view up to date
        ends = self.budgets.view.book.get(worker.lineage).expires_at_ms or 0
        until = max(ends, now_ms()) + self.rng.randint(300, 2_000)
        self.tally["renewals"] += 1
        self.budgets.renew(worker.lineage, until)
        self.tally["renewals_committed"] += 1
        worker.lease_end_ms = until

    def idle(self) -> None:
        time.sleep(self.rng.uniform(0.05, 0.4))


def run(url: str, home: str, seconds: float, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    paced = os.environ.get("CHARTER_MIXER_UNPACED") != "1"
    if os.environ.get("CHARTER_MIXER_NO_SETTLED_TIME") == "1":
        LeaseBook._unsettled = _slow.nothing_unsettled  # type: ignore[method-assign]
    env = None
    if os.environ.get("CHARTER_HOLD_KINDS"):
        _slow.configure_from_environ()
        env = _slow.env(url)
    with Journal.open(url, env=env) as journal:
        mixer = Mixer(journal, Path(home), rng)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            period_ends = time.monotonic() + rng.uniform(*PERIOD_S)
            mixer.step()
            if paced:
                time.sleep(max(rng.uniform(*PAUSE_S), period_ends - time.monotonic()))
    return {**mixer.tally, "errors": dict(sorted(mixer.errors.items()))}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))))
