"""Test events and a writer process for the journal contract suite."""

from __future__ import annotations

import sys

from charter.core import Event
from charter.ledger import Journal


class Ping(Event):
    """A test fact: which writer, which batch, which item."""

    type_name = "TestPing"
    writer: str
    batch: int
    n: int
    pad: str = ""


class Counter(Event):
    """A test event on a named stream (versioned, conflicts on stale appends)."""

    type_name = "TestCounter"
    name: str
    value: int

    def stream(self) -> str:
        return f"counter:{self.name}"


def write(url: str, writer: str, batches: int, batch_size: int) -> None:
    """Append ``batches`` batches of ``batch_size`` pings, announcing each commit."""
    with Journal.open(url) as journal:
        for b in range(batches):
            journal.append(Ping(writer=writer, batch=b, n=i) for i in range(batch_size))
            print(b, flush=True)


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
