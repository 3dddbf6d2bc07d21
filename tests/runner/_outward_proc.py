"""One outward call in its own process, killed (SIGKILL) at a chosen point.

    python -m tests.runner._outward_proc JOURNAL_URL LINEAGE KEY URL POINT

POINT: ``before-intent`` (killed before the call is made), ``after-intent`` (killed as
the send begins: the intent has committed, nothing was sent), ``after-send`` (killed
once the destination answered, before the outcome is journaled), ``after-outcome``
(killed once the call returned), ``none`` (prints the answer's JSON).
"""

from __future__ import annotations

import json
import os
import signal
import sys

from charter.control.outward import OutwardCalls
from charter.ledger import Journal
from tests.runner._outward_client import digest_of, post


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    url, lineage, key, target, point = sys.argv[1:6]
    journal = Journal.open(url)
    calls = OutwardCalls(journal)
    if point == "before-intent":
        _die()

    def send():  # type: ignore[no-untyped-def]
        if point == "after-intent":
            _die()
        reply = post(target, key)
        if point == "after-send":
            _die()
        return reply

    answer = calls.act(lineage, key, digest_of(target, key), "127.0.0.1", send)
    if point == "after-outcome":
        _die()
    print(json.dumps(answer.to_json()))


if __name__ == "__main__":
    main()
