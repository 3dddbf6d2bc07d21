"""One of the mixed-load workers: until its deadline, at random (seeded), fan out from
the root or from a worker it spawned, record usage on one of its workers (sometimes more
than it holds), release one, renew one, or idle a moment so short leases expire.

Refusals and lost races (every ``CharterError``) are expected outcomes and are counted;
anything else crashes the process. Prints one JSON line of counts at the end.

Run as ``python -m tests.budgets._mixer URL HOME SECONDS SEED`` from the repository root.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from charter.control import BudgetService, Caller
from charter.core import Budget, CharterError, KeyStore, RefusedError, now_ms
from charter.ledger import Journal
from tests.budgets._support import intent, service

LIFETIME_MS = (1_000, 4_000)  # a lease's wall-clock allocation is its lifetime
PAUSE_S = (0.002, 0.01)  # between operations, so 16 processes on 2 cores interleave
STALE_MS = 1_500  # a worker is still tried this long after its grant ended (refusals)
OPERATIONS = ("fanout", "usage", "release", "renew", "idle")
WEIGHTS = (30, 35, 10, 12, 13)


@dataclass
class Worker:
    caller: Caller

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
            refused=0,
            refusals=0,
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
        """Forget workers whose grant ended a while ago (they were still tried for a
        moment after it ended: those attempts are refused)."""
        now = now_ms()
        self.workers = [w for w in self.workers if w.grant_end_ms + STALE_MS > now]

    def pick(self) -> Worker:
        return self.rng.choice(self.workers)

    # -- the operations -----------------------------------------------------------

    def fanout(self) -> None:
        rng = self.rng
        if not self.workers or rng.random() < 0.5:
            caller, fraction, width, allowance = self.root, rng.uniform(0.001, 0.02), 3, 6
        else:
            caller, fraction, width, allowance = self.pick().caller, rng.uniform(0.1, 0.9), 2, 2
        width = rng.randint(1, width)
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
        worker = self.pick()
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
        """Extend a worker's lease a little past where it ends now (as this process last
        saw it): other processes' releases and expiries may still refuse it."""
        worker = self.pick()
        self.budgets.remaining(worker.lineage)  # brings the view up to date
        ends = self.budgets.view.book.get(worker.lineage).expires_at_ms or 0
        until = max(ends, now_ms()) + self.rng.randint(300, 2_000)
        self.budgets.renew(worker.lineage, until)
        self.tally["renewals"] += 1

    def idle(self) -> None:
        time.sleep(self.rng.uniform(0.05, 0.4))


def run(url: str, home: str, seconds: float, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    with Journal.open(url) as journal:
        mixer = Mixer(journal, Path(home), rng)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            mixer.step()
            time.sleep(rng.uniform(*PAUSE_S))
    return {**mixer.tally, "errors": dict(sorted(mixer.errors.items()))}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))))
