"""Another host whose clock is behind (for test_clock_skew.py): its decisions and the
commit times its recorder stamps both read a wall clock ``SKEW_MS`` behind this one's.

On "go" (a line on stdin) it records ``tokens=100k`` of usage against LINEAGE, then
prints what happened. Run as ``python -m tests.budgets._behind URL LINEAGE SKEW_MS``.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta, tzinfo

import charter.ledger._rows as rows
from charter.control import BudgetService
from charter.core import Budget, CharterError, now_ms
from charter.ledger import Journal


def main(url: str, lineage: str, skew_ms: int) -> None:
    behind = timedelta(milliseconds=skew_ms)

    class Behind(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Behind:  # type: ignore[override]
            return datetime.now(tz or UTC) - behind  # type: ignore[return-value]

    rows.datetime = Behind  # type: ignore[misc]  # the recorder's stamp: this host's clock
    with Journal.open(url) as journal:
        budgets = BudgetService(journal, clock=lambda: now_ms() - skew_ms)
        budgets.remaining(lineage)  # folded before the signal
        print("ready", flush=True)
        sys.stdin.readline()
        spend = Budget.parse("tokens=100k,wall=0s,cpu=0s,mem=0B,egress=0B")
        try:
            budgets.record_usage(lineage, spend)
        except CharterError as e:
            print(f"refused {type(e).__name__}", flush=True)
        else:
            print("committed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
