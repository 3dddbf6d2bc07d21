"""The log pump and a worker's end never copy one worker at once: when the pump is in
the middle of a copy as the command ends, ``finish`` waits for it, so no chunk is
appended twice and no stale one lands after the tail (the race a loaded CI host hit:
a flood's kept file ended in its middle, not its last line)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import cast

from charter.runner._logs import PUMP_S, WorkerLogs, log_dir
from charter.sandbox import Slot

OUTPUT = b"x" * 100_000 + b"\nEND\n"


class _Gated:
    """A slot's output, read from memory: the pump thread's first read is held until
    the test lets it go, so the test decides the interleaving."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()

    def output(self, stream: str, offset: int, limit: int) -> bytes:
        data = OUTPUT[offset : offset + limit] if stream == "stdout" else b""
        if threading.current_thread().name == "logs" and data and not self.entered.is_set():
            self.entered.set()
            assert self.go.wait(30), "the test never let the pump go"
        return data


def test_finish_waits_for_the_pumps_copy_and_keeps_the_exact_output(tmp_path: Path) -> None:
    logs = WorkerLogs(tmp_path)
    gated = _Gated()
    try:
        logs.track("agent:a/w", cast(Slot, gated))
        assert gated.entered.wait(30 + 10 * PUMP_S), "the pump never copied"
        # The pump holds a chunk it read but has not appended; the command ends now.
        finished = threading.Event()

        def end() -> None:
            logs.finish("agent:a/w")
            finished.set()

        ender = threading.Thread(target=end)
        ender.start()
        # Under the fix, finish waits for the pump's copy: it cannot be done yet.
        # (Without it, finish copied everything at once and the pump's stale chunk
        # landed after END, which the exact comparison below catches either way.)
        assert not finished.wait(0.5)
        gated.go.set()
        ender.join(30)
        assert finished.is_set()
    finally:
        gated.go.set()
        logs.close()
    assert (log_dir(tmp_path, "agent:a/w") / "stdout").read_bytes() == OUTPUT


def test_control_without_the_pump_copy_finish_keeps_the_exact_output(tmp_path: Path) -> None:
    """Positive control: with no copy under way, finish alone writes the exact output."""
    logs = WorkerLogs(tmp_path)
    logs.close()  # no pump: only finish copies
    gated = _Gated()
    logs.track("agent:a/w", cast(Slot, gated))
    logs.finish("agent:a/w")
    assert (log_dir(tmp_path, "agent:a/w") / "stdout").read_bytes() == OUTPUT
