"""One of the concurrent spawners: fan out under the root, admit the workers to
processing slots (backing off for the retry-after it is given), hold, release."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from charter.budgets import AdmissionRefusedError, CapInputs, ResourceClass
from charter.control import AdmissionService
from charter.core import Budget, KeyStore, StateError
from charter.ledger import Journal
from tests.budgets._support import intent, service

COST = Budget.parse("tokens=2k,wall=60s,cpu=10s,mem=1MiB,egress=1KB")


def run(url: str, home: str, seconds: float, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    tally = {"spawns": 0, "admitted": 0, "refused": 0, "refused_without_retry_after": 0}
    with Journal.open(url) as journal:
        svc = service(journal, KeyStore(Path(home)))
        root = svc.durable_caller("root")
        slots = AdmissionService(journal)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                result = svc.spawn(root, intent(rng.randint(1, 2), COST, fanout=0))
            except StateError:  # lost the race for the root's stream three times: again
                continue
            tally["spawns"] += 1
            workers = [str(c.lineage) for c in result.children]
            # Host inputs pinned (16 spawners on 2 cores would throttle the adaptive cap to
            # 0 and refuse everything); the adaptive cap has its own test.
            inputs = CapInputs(cores=2, failover_reserve=0, load_average=0.0, live_peers=0)
            while time.monotonic() < deadline:
                try:
                    slots.admit("cell-a", workers, ResourceClass.PROCESSING, inputs)
                except AdmissionRefusedError as e:
                    tally["refused"] += 1
                    if e.retry_after_ms <= 0:
                        tally["refused_without_retry_after"] += 1
                    time.sleep(e.retry_after_ms / 1000)  # backpressure: wait as told
                    continue
                tally["admitted"] += len(workers)
                time.sleep(rng.uniform(0.0, 0.05))  # the work
                for worker in workers:
                    slots.release("cell-a", worker, ResourceClass.PROCESSING)
                break
    return tally


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))))
