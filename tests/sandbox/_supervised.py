"""A worker running in a leased warm-pool slot on a thread, with the host's view of its
workspace (through ``/proc/<pid>/root``), for the supervision mechanism tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from charter.sandbox import Outcome, Slot, WarmPool, sandbox_pid

PY = "/usr/bin/python3"

# Counts as fast as it can into /workspace/counter (fixed width, one pwrite a step), and
# stops once the host makes /workspace/stop.
COUNTER = r"""
import os
fd = os.open("/workspace/counter", os.O_WRONLY | os.O_CREAT, 0o644)
i = 0
while not os.path.exists("/workspace/stop"):
    i += 1
    os.pwrite(fd, b"%020d" % i, 0)
"""

# Burns CPU until the host makes /workspace/stop.
BUSY = r"""
import os
n = 0
while True:
    for _ in range(200000):
        n += 1
    if os.path.exists("/workspace/stop"):
        break
"""

# Forks until pids.max refuses (the children sleep); needs os and time imported.
FORK_TO_LIMIT = r"""
kids = []
try:
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError:
    pass
"""


def wait_for(what: Callable[[], object], timeout: float = 10.0, step: float = 0.005) -> object:
    """Poll ``what`` until it is truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(step)


class Running:
    """``code`` running in a fresh slot of ``pool`` on a thread; ``outcome`` once done."""

    def __init__(self, pool: WarmPool, code: str, before: Callable[[Slot], None] | None = None):
        self.pool = pool
        self.slot = pool.lease()
        self.pid = sandbox_pid(self.slot.spec)
        assert self.pid is not None
        self.workspace = Path(f"/proc/{self.pid}/root/workspace")
        if before is not None:
            before(self.slot)
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(code,), daemon=True)
        self._thread.start()

    def _run(self, code: str) -> None:
        try:
            self.outcome = self.slot.run([PY, "-I", "-c", code])
        except BaseException as e:  # reported by join()
            self.error = e

    def counter(self) -> int:
        try:
            raw = (self.workspace / "counter").read_bytes()[:20]
        except OSError:
            return 0
        return int(raw) if raw.strip(b"\0") else 0

    def stop(self) -> None:
        """Make /workspace/stop (the worker's own signal to end)."""
        (self.workspace / "stop").write_text("")

    def join(self, timeout: float = 30.0) -> Outcome:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the worker did not end"
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome

    def done(self) -> bool:
        return not self._thread.is_alive()

    def release(self) -> None:
        if self._thread.is_alive() and self.slot.proc is not None:
            self.slot.proc.kill()
            self._thread.join(30)
        self.pool.release(self.slot, refill=False)
