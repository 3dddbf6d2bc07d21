"""What a worker asks through its door, answered for the worker its sandbox runs.

The caller is always resolved by the cell from the sandbox (the door passes the lineage
it found for the peer's host uid), never taken from a request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from nacl.signing import SigningKey

from charter.authority import SpawnIntent
from charter.control import Caller, SpawnResult, WorkerSpec
from charter.core import Lineage, LineageError
from charter.runner._journal_allowance import delegate_bytes, spawn_bytes, wait_bytes
from charter.runner._view import WorkerRecord
from charter.runner.cell import Cell
from charter.runner.errors import (
    ResultTooLargeError,
    RevokeRefusedError,
    WaitRefusedError,
    WorkerGoneError,
)
from charter.runner.events import RESULT_CAP, WorkerWaiting

__all__ = ["WorkerRequests"]


class WorkerRequests:
    """``spawn``, ``wait`` and ``result`` for the workers of ``cell``, through the
    cell's worker-facing methods only (``chain``, ``spawn``, ``workers``, ``kill``, ``revoke``,
    ``wait_on_children``, ``resume_processing``, ``holds_processing``,
    ``journal_result``, ``custody_seed``, ``journal_allowance``) and its ``changed``
    condition to wait on."""

    def __init__(
        self, cell: Cell, uncharged: Callable[[], AbstractContextManager[object]] = nullcontext
    ) -> None:
        """``uncharged`` wraps what a request does while it only waits (for children to
        end, for a processing slot): the door leaves that out of the CPU it charges
        the worker (its polling is bounded by the wait's timeout, not by the worker)."""
        self.cell = cell
        self.uncharged = uncharged

    def caller(self, lineage: str) -> Caller:
        """The worker as a caller: its journaled chain and its custody key, derived from
        the root's custody key along the committed grants."""
        return Caller(self.cell.chain(lineage), self._signing_key(lineage))

    def spawn(
        self, lineage: str, intent: SpawnIntent, workers: tuple[WorkerSpec, ...]
    ) -> SpawnResult:
        # The process's one spawn pipeline: the operator's ceilings and gate hold here
        # exactly as for ``charter spawn``; the children's worker-chosen bytes are
        # charged to the caller's journal allowance first.
        allowance = self.cell.journal_allowance
        with allowance.held(lineage):
            allowance.charge(lineage, spawn_bytes(intent.width, workers))
            return self.cell.spawn(self.caller(lineage), intent, workers)

    def wait(
        self,
        lineage: str,
        children: tuple[str, ...],
        timeout_s: float,
        stopped: Callable[[], bool] = lambda: False,
    ) -> dict[str, object]:
        """Wait on ``children`` (each must be a child of ``lineage``, or its delegate):
        the processing slot goes back and a coordination slot is held meanwhile; when
        they end, the worker queues for processing again and the answer comes once it
        holds it. On timeout every child still live is killed (journaled first); so it
        is when ``stopped()`` says the caller stopped waiting (its connection closed:
        the answer then reaches nobody, but the slots are swapped back all the same)."""
        children = tuple(dict.fromkeys(children))  # each named once
        known = self.cell.workers(children)
        for child in children:
            # Only children it spawned or delegates it started (so a wait's journaled
            # size is bounded by its fan-out), never a name of one it did not.
            mine = Lineage(child).parent == Lineage(lineage)
            if not (mine or self.cell.delegated_by(child) == lineage) or known[child] is None:
                raise WaitRefusedError(f"{child} is not a child {lineage} spawned")
        self._swap_for_coordination(lineage, children, timeout_s)
        deadline = time.monotonic() + timeout_s
        why = ""
        try:
            with self.uncharged(), self.cell.changed:
                while True:
                    records = self.cell.workers(children).values()
                    live = [w for w in records if w is not None and w.live]
                    if not live:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        why = "timed out"
                        break
                    if stopped():
                        why = "its connection closed"
                        break
                    self.cell.changed.wait(min(left, 0.05))
        finally:
            # (A caller that ended raises WorkerGoneError here: the cell kills what it
            # waited for as it ends it, each kill journaled first.)
            if why:
                for child in children:
                    self.cell.kill(child, f"{lineage} stopped waiting ({why})")
        timed_out = why == "timed out"
        self._back_to_processing(lineage)
        ended = self.cell.workers(children)
        return {c: self._answer(w) for c, w in ended.items()} | {"timed_out": timed_out}

    @staticmethod
    def _answer(w: WorkerRecord | None) -> object:
        if w is None:
            return {"status": "unknown"}
        if w.ended is None:
            return {"status": "running"}
        return {
            "status": w.ended.outcome,
            "exit_code": w.ended.exit_code,
            "result": w.result.text if w.result is not None else None,
            "digest": w.result.digest if w.result is not None else None,
            "reason": w.ended.reason,
        }

    def _swap_for_coordination(
        self, lineage: str, children: tuple[str, ...], timeout_s: float
    ) -> None:
        waiting = WorkerWaiting(
            lineage=lineage, children=children, timeout_ms=int(timeout_s * 1000)
        )
        allowance = self.cell.journal_allowance
        with allowance.held(lineage):  # charged, then journaled
            allowance.charge(lineage, wait_bytes(waiting))
            self.cell.wait_on_children(lineage, waiting)

    def _back_to_processing(self, lineage: str) -> None:
        """Give back the coordination slot and take (or queue for) a processing one;
        return once it is held."""
        self.cell.resume_processing(lineage)
        with self.uncharged(), self.cell.changed:
            while not self.cell.holds_processing(lineage):
                self.cell.changed.wait(0.05)

    def revoke(self, lineage: str, target: str, reason: str) -> int | None:
        """Revoke ``target``, a descendant of ``lineage`` (and only that: never itself,
        a sibling, an ancestor or another tree), and its subtree: one append pinned so
        a racing mint loses (:func:`charter.control.revoke`); the cell then kills what
        of it runs. The position it committed at; None if it already was revoked."""
        try:
            below = Lineage(lineage).is_ancestor_of(Lineage(target))
        except LineageError:
            below = False
        if not below:
            raise RevokeRefusedError(f"{target} is not a descendant of {lineage}")
        return self.cell.revoke(target, reason or f"revoked by its ancestor {lineage}")

    def delegate(
        self,
        lineage: str,
        agent: str,
        inputs: tuple[str, ...],
        timeout_s: float,
        stopped: Callable[[], bool] = lambda: False,
    ) -> dict[str, object]:
        """Delegate to own-sandbox agent ``agent`` (docs/delegation.md) and wait for its
        reply, as for a child (its slot swapped for a coordination one; on timeout, or
        when the caller stops waiting, the delegate is killed). Only the reply comes
        back: its status and its result text, never its exit code, stderr or reason
        (which could carry what the caller may not see); the reply is journaled
        (``DelegationReplied``) before it is returned."""
        allowance = self.cell.journal_allowance
        with allowance.held(lineage):  # its inputs are the caller's bytes, charged first
            allowance.charge(lineage, delegate_bytes(inputs))
            started = self.cell.delegate(self.caller(lineage), agent, inputs)
        (delegate,) = (str(c.lineage) for c in started.children)
        answer = self.wait(lineage, (delegate,), timeout_s, stopped)
        if stopped():  # nobody to reply to: no reply is journaled
            raise WorkerGoneError(f"{lineage} stopped waiting for {delegate}")
        reply = answer[delegate]
        if not isinstance(reply, dict):  # _answer gives a dict for every child
            raise TypeError(f"no answer for {delegate}")
        self.cell.delegation_replied(lineage, delegate, str(reply["status"]), reply.get("digest"))
        return {
            "delegate": delegate,
            "status": reply["status"],
            "reply": reply.get("result"),
            "digest": reply.get("digest"),
            "timed_out": answer["timed_out"],
        }

    def result(self, lineage: str, data: bytes) -> str:
        if len(data) > RESULT_CAP:
            raise ResultTooLargeError(
                f"a result holds at most {RESULT_CAP} bytes, not {len(data)}; write less"
            )
        return self.cell.journal_result(lineage, data)

    def _signing_key(self, lineage: str) -> SigningKey:
        return SigningKey(self.cell.custody_seed(lineage))
