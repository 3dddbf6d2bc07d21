"""Mixed load: ``PROCESSES`` mixers (tests/budgets/_mixer.py) on one journal, started
and waited for, and with ``faults`` commits held open after their stamp
(tests/budgets/_slow.py) and mixers SIGKILLed at random (half the time one holding the
write lock) and started again. Used by test_mixed_load.py and bench/mixed.py."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import _slow

ROOT_DIR = Path(__file__).resolve().parents[2]
PROCESSES = 16
WAIT_S = 300  # for all of them, past the end of the load
# The faults: each budget append is held open after its stamp with this chance, for a
# draw from this range (s); a mixer is SIGKILLed every KILL_EVERY_S (a draw), half the
# time one that is holding the write lock if any is, and started again.
HOLD_CHANCE, HOLD_S = 0.03, (0.05, 0.6)
KILL_EVERY_S = (3.0, 10.0)
HOLD_WAIT_S = 3.0  # how long a kill aimed inside a held commit waits for one


@dataclass
class Load:
    """``PROCESSES`` mixers on one journal for ``seconds``; with ``faults``, commits
    held open after their stamp and mixers SIGKILLed (and started again) at random."""

    url: str
    home: Path
    seconds: float
    faults: bool = False
    seed: int = 0
    env: dict[str, str] = field(default_factory=dict)  # more settings for the mixers
    totals: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    kills: int = 0
    kills_holding: int = 0
    started: int = 0

    def __post_init__(self) -> None:
        self.log, self.holding = self.home / "holds.log", self.home / "holding"
        self.holding.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(self.seed)

    def _spawn(self, seed: int, seconds: float) -> subprocess.Popen[str]:
        env = {"PYTHONPATH": str(ROOT_DIR), "PATH": "/usr/bin:/bin"}
        if "XDG_RUNTIME_DIR" in os.environ:  # the test's own (shared commits' files)
            env["XDG_RUNTIME_DIR"] = os.environ["XDG_RUNTIME_DIR"]
        env |= self.env
        if self.faults:
            env |= _slow.environ(_slow.KINDS, HOLD_S, HOLD_CHANCE, self.log, self.holding)
        self.started += 1
        return subprocess.Popen(
            [sys.executable, "-m", "tests.budgets._mixer", self.url, str(self.home),
             f"{seconds:.1f}", str(seed)],
            cwd=ROOT_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    def run(self) -> None:
        began = time.monotonic()
        end = began + self.seconds
        mixers = [self._spawn(self.seed * 1000 + i, self.seconds) for i in range(PROCESSES)]
        try:
            while self.faults:
                pause = self.rng.uniform(*KILL_EVERY_S)
                if time.monotonic() + pause >= end - 2:
                    break
                time.sleep(pause)  # the next fault's moment (a random one, by design)
                mixers = self._kill_one(mixers, end)
            for i, mixer in enumerate(mixers):
                wait = max(1.0, end + WAIT_S - time.monotonic())
                out, err = mixer.communicate(timeout=wait)
                if mixer.returncode != 0:
                    self.failures.append(f"mixer {i} exited {mixer.returncode}:\n{err[-4000:]}")
                    continue
                counts = json.loads(out.strip().splitlines()[-1])
                self.errors.update(counts.pop("errors"))
                self.totals.update(counts)
        finally:
            for mixer in mixers:  # only on a timeout or a crash of this test: none linger
                if mixer.poll() is None:
                    mixer.kill()
                    mixer.wait()
        self.ran = time.monotonic() - began

    def _kill_one(
        self, mixers: list[subprocess.Popen[str]], end: float
    ) -> list[subprocess.Popen[str]]:
        """SIGKILL one mixer (half the time one holding the write lock, if any is) and
        start another in its place for the rest of the load."""
        pids = {m.pid: i for i, m in enumerate(mixers)}
        holding: list[int] = []
        if self.rng.random() < 0.5:  # inside a held commit: wait for one, a little
            deadline = time.monotonic() + HOLD_WAIT_S
            while not holding and time.monotonic() < deadline:
                holding = [pids[int(p.name)] for p in self.holding.iterdir() if int(p.name) in pids]
                time.sleep(0.01)
        chosen = bool(holding)
        i = self.rng.choice(holding) if chosen else self.rng.randrange(len(mixers))
        victim = mixers[i]
        if victim.poll() is not None:  # it ended on its own: a failure unless it said so
            _, err = victim.communicate()
            self.failures.append(f"mixer {i} ended early ({victim.returncode}):\n{err[-4000:]}")
        else:
            victim.send_signal(signal.SIGKILL)
            victim.communicate()
            self.kills += 1
            self.kills_holding += bool(chosen)
        (self.holding / str(victim.pid)).unlink(missing_ok=True)  # it cannot clear it
        mixers[i] = self._spawn(self.seed * 1000 + self.started, end - time.monotonic())
        return mixers

    def holds(self) -> Counter[str]:
        """The holds injected, by the kinds of event they held."""
        if not self.log.exists():
            return Counter()
        return Counter(line.split()[1] for line in self.log.read_text().splitlines())
