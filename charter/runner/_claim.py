"""The incarnation's hold on its cell: its claim, taken, renewed and given up.

The claim itself (what is journaled, pinned to what) is the handler's
(:class:`charter.control.WorkerLifecycle`); this is the process side of it: waiting for
a held claim to lapse, renewing on a thread of its own every third of its length, and
saying once the incarnation is fenced.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from charter.control import CellSupersededError, WorkerLifecycle
from charter.core import CharterError, now_ms
from charter.runner._view import WorkersView
from charter.runner.errors import CellClaimHeldError
from charter.runner.events import CellStarted

__all__ = ["DEFAULT_CLAIM_S", "Claimant"]

DEFAULT_CLAIM_S = 15.0  # how long an incarnation's claim holds between renewals
_POLL_S = 0.5  # a start waiting for a held claim looks again this often


class Claimant:
    """``cell``'s claim, as this process holds it through ``lifecycle``."""

    def __init__(
        self, lifecycle: WorkerLifecycle, view: WorkersView, cell: str, classes: tuple[str, ...]
    ) -> None:
        self.lifecycle = lifecycle
        self.classes = classes  # journaled with each incarnation it starts
        self.view = view
        self.cell = cell
        self._closing = threading.Event()
        self._renewer: threading.Thread | None = None

    def take(
        self, *, claim_s: float, take_over: bool, wait_s: float | None, stop: Callable[[], bool]
    ) -> CellStarted:
        """Journal this incarnation's ``CellStarted`` with its claim: while the last
        incarnation's claim holds, wait for it to lapse (up to ``wait_s``, None: as long
        as it takes; ``stop()`` ends the wait), unless ``take_over``."""
        given_up = None if wait_s is None else time.monotonic() + wait_s
        while True:
            started = self.lifecycle.begin(
                os.getpid(),
                socket.gethostname(),
                claim_ms=int(claim_s * 1000),
                last=self.last,
                take_over=take_over,
                classes=self.classes,
            )
            if started is not None:
                return started
            incarnation, until = self.view.claim(self.cell)
            left = ((until or 0) - now_ms()) / 1000
            if stop() or (given_up is not None and time.monotonic() >= given_up):
                raise CellClaimHeldError(
                    f"cell {self.cell}: incarnation {incarnation} holds it for {left:.1f} s "
                    "more (it renews its claim while it runs); wait for it to stop, or take "
                    "it over (`charter cell run --take-over`)"
                )
            time.sleep(min(max(left, 0.01), _POLL_S))

    def last(self) -> tuple[int, int | None]:
        """The newest incarnation and when its claim lapses, as the lifecycle decides on
        it (hold the views' lock). One whose process is gone from this host (it
        crashed, or the host rebooted and its pid is free) can never renew: its claim is
        over now."""
        incarnation, until = self.view.claim(self.cell)
        started = self.view.started.get(self.cell)
        if (
            started is not None
            and started.host == socket.gethostname()
            and started.pid != os.getpid()
            and not process_alive(started.pid)
        ):
            return incarnation, None
        return incarnation, until

    def renew_every_third(
        self, claim_s: float, fenced: Callable[[CellSupersededError], None]
    ) -> None:
        """Renew the claim every third of ``claim_s`` until :meth:`stop`, on a thread of
        its own. A renewal refused because the claim moved (another incarnation took
        the cell over) or lapsed calls ``fenced`` and stops renewing."""

        def renew() -> None:
            while not self._closing.wait(claim_s / 3):
                try:
                    self.lifecycle.renew(int(claim_s * 1000))
                except CellSupersededError as error:
                    fenced(error)
                    return
                except CharterError:
                    continue  # the journal was unavailable: tried again before the lapse

        self._renewer = threading.Thread(target=renew, name=f"claim-{self.cell}", daemon=True)
        self._renewer.start()

    def stop(self) -> None:
        """Renew no more."""
        self._closing.set()
        if self._renewer is not None:
            self._renewer.join(timeout=30)

    def give_up(self) -> None:
        """End the claim now (a renewal to now): the next incarnation takes the cell at
        once. A claim already fenced or lapsed is left as it is."""
        self.lifecycle.give_up()


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process on this host (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")
