"""Each worker's live stdout and stderr, kept by its cell in bounded files on the host
(``charter logs``): a pump copies what the sandbox has written since its last look,
every :data:`PUMP_S`, and once more when the command ends. A file keeps at most
:data:`LOG_CAP` bytes, the newest: when it grows past twice that, it is cut to its tail.
The files stay after the worker ends (the tail of a finished worker), under
``<state dir>/logs/``, readable by root only.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from charter.sandbox import Slot

__all__ = ["LOG_CAP", "PUMP_S", "STREAMS", "WorkerLogs", "log_dir"]

LOG_CAP = 256 * 1024  # bytes of each stream's tail kept per worker
PUMP_S = 0.2  # how often the pump copies what was written
STREAMS = ("stdout", "stderr")
_READ = 64 * 1024  # bytes read from a stream at a time


def log_dir(state_dir: Path, lineage: str) -> Path:
    """Where ``lineage``'s log files live (its name hashed: a lineage is not a path)."""
    return state_dir / "logs" / hashlib.sha256(lineage.encode()).hexdigest()[:32]


@dataclass
class _Tracked:
    slot: Slot
    directory: Path
    read: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STREAMS, 0))
    # One copy at a time: the pump and ``finish`` may both copy a worker as it ends,
    # and two copies from one offset would append a chunk twice, or a stale one last.
    copying: threading.Lock = field(default_factory=threading.Lock)


class WorkerLogs:
    """The pump of one cell: tracks the sandboxes whose output it copies."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="logs", daemon=True)
        self._thread.start()

    def track(self, lineage: str, slot: Slot) -> None:
        """Copy ``slot``'s output to ``lineage``'s files from now on (new, empty files)."""
        directory = log_dir(self.state_dir, lineage)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.state_dir / "logs").chmod(0o700)
        for stream in STREAMS:
            path = directory / stream
            path.write_bytes(b"")
            path.chmod(0o600)
        with self._lock:
            self._tracked[lineage] = _Tracked(slot, directory)

    def finish(self, lineage: str) -> None:
        """The command ended: copy what is left (after a copy the pump has under way),
        then stop tracking it."""
        with self._lock:
            tracked = self._tracked.pop(lineage, None)
        if tracked is not None:
            self._copy(tracked)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(PUMP_S):
            with self._lock:
                tracked = list(self._tracked.values())
            for one in tracked:
                self._copy(one)

    @staticmethod
    def _copy(tracked: _Tracked) -> None:
        with tracked.copying:
            for stream in STREAMS:
                while True:
                    data = tracked.slot.output(stream, tracked.read[stream], _READ)
                    if not data:
                        break
                    tracked.read[stream] += len(data)
                    _append(tracked.directory / stream, data)


def _append(path: Path, data: bytes) -> None:
    """Append ``data``; past twice the cap, keep only the newest :data:`LOG_CAP` bytes."""
    try:
        with path.open("ab") as f:
            f.write(data)
            size = f.tell()
        if size > 2 * LOG_CAP:
            with path.open("rb") as f:
                f.seek(size - LOG_CAP)
                tail = f.read()
            tmp = path.with_suffix(".cut")
            tmp.write_bytes(tail)
            tmp.chmod(0o600)
            os.replace(tmp, path)
    except OSError:
        return  # the state dir went away: a log is a convenience, never the worker's end
