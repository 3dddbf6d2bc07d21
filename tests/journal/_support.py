"""Test events and a writer process for the journal contract suite."""

from __future__ import annotations

import sys
import threading
import time
from types import CodeType

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


class Gathering:
    """Threads met inside one function: :meth:`join` from each thread first, then
    :meth:`wait` (from a hook inside ``code``) until every one of them is inside
    ``code`` at once, running or blocked there (never a guess of time: their stacks
    are looked at)."""

    def __init__(self, threads: int, code: CodeType) -> None:
        self._threads, self._code = threads, code
        self._idents: set[int] = set()
        self._met = False  # once they all were inside, every wait is over

    def join(self) -> None:
        self._idents.add(threading.get_ident())

    def wait(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self._all_inside():
            assert time.monotonic() < deadline, "the threads never all got inside"
            time.sleep(0.001)

    def _all_inside(self) -> bool:
        if self._met:
            return True
        if len(self._idents) < self._threads:
            return False
        frames = sys._current_frames()
        for ident in self._idents:
            frame = frames.get(ident)
            while frame is not None and frame.f_code is not self._code:
                frame = frame.f_back
            if frame is None:
                return False
        self._met = True
        return True
