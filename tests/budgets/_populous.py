"""One of the spawners racing for the fabric's population (tests/budgets/test_population.py):
open the journal with a population ceiling, wait at the barrier, then fan out width 1
under its own root until refused; print what each try got.

    python3 -m tests.budgets._populous URL HOME ROOT CEILING BARRIER_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from charter.app import Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.budgets import FabricCeilings
from charter.core import Budget, CharterError, KeyStore

ONE = SpawnIntent(
    width=1,
    objective="one worker of a root racing the others for the fabric",
    estimated_cost=Budget.parse("tokens=1k,wall=1h,cpu=1m,mem=0,egress=0"),
)
TRIES = 3


def main() -> None:
    url, home, root, ceiling, barrier = sys.argv[1:6]
    settings = Settings(ceilings=FabricCeilings(population=int(ceiling)))
    outcomes: list[str] = []
    with Charter.open(url, keys=KeyStore(Path(home)), settings=settings) as charter:
        charter.agents()  # the views read before the barrier: the race is the decision
        (Path(barrier) / root).touch()
        while not (Path(barrier) / "go").exists():  # the barrier: every racer is ready
            time.sleep(0.001)
        for _ in range(TRIES):
            try:
                charter.spawn(f"agent:{root}", ONE, policy=FixedPolicy(Verdict.POSITIVE))
                outcomes.append("ok")
            except CharterError as e:
                outcomes.append(str(getattr(e, "reason", type(e).__name__)))
                break
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()
