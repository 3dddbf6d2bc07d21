"""What a worker can make the journal hold: a per-lease allowance (docs/door.md,
decision 0012).

Every journal write a worker causes through its door (its result, its waits, the
worker-chosen bytes of its spawns) or by its stdout (the result a silent worker answers
with) is **charged before it is appended**: the first :data:`FLOOR` bytes of each lease
are free (so a worker whose lease has no egress can still answer and wait), and every
byte past them is charged to the lease's *egress* axis (bytes leaving the sandbox, to
the journal), by a ``UsageRecorded`` committed before the write it pays for. Egress is
carved from the parent like every axis, so a worker tree causes at most

    (leases its root's fan-out allows, 1 + fanout) × FLOOR + the root lease's egress

journal bytes of this kind, plus each lease's fixed-size events (its grant, lease, slots
and lifecycle: bounded per lease by the models). A write the lease cannot pay for is
refused (``journal-allowance``), the first refusal of each lease journaled as a
``BudgetRefused`` (so a flood of refusals journals one).

A charge is an upper bound of what the write stores (:func:`result_bytes`,
:func:`wait_bytes`, :func:`spawn_bytes`: canonical JSON of the payload plus
:data:`ENTRY_OVERHEAD` for the entry and the fixed-size events the request brings), so
the independent fold (``tests/invariants.py``) can check, at every position, that the
journaled bytes of each worker are at most ``FLOOR`` + the egress charged to it. The
floor's use is counted in this process (a worker never outlives its cell's process: a
restarted cell fails it), including requests refused after their charge (a refused
spawn journals its refusal), so the count is never below what the journal holds.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from charter.budgets import BudgetRefused, UsageRecorded
from charter.control import WorkerSpec
from charter.core import Budget, Event, now_ms
from charter.core.events import canonical_json
from charter.ledger import Committed
from charter.runner.errors import JournalAllowanceError, ResultGivenError
from charter.runner.events import (
    RESULT_CAP,
    ModelCallReserved,
    ModelCallSettled,
    ModelTokensHeld,
    WorkerResult,
    WorkerWaiting,
)

__all__ = [
    "ENTRY_OVERHEAD",
    "FLOOR",
    "WAIT_ENTRIES",
    "JournalAllowance",
    "result_bytes",
    "spawn_bytes",
    "delegate_bytes",
    "model_block_bytes",
    "model_call_bytes",
    "model_draw_bytes",
    "wait_bytes",
]

FLOOR = 128 * 1024
"""Journal bytes each lease may cause without charge: one result of 64 KiB and room for
its waits and spawns."""

ENTRY_OVERHEAD = 384
"""Bytes charged for each entry a request journals beyond what its payload holds: the
entry's envelope (commit time, batch id, chain hashes, stream and version), or one
fixed-size event it brings whole (a slot's release or admission; a refusal). Measured
on SQLite, these are 250-352 bytes each (docs/performance.md)."""

WAIT_ENTRIES = 6
"""The entries one wait journals: ``WorkerWaiting``, the swap to a coordination slot (a
release and an admission) and the resume (a release, and an admission, queued first
while the processing slots are taken)."""


def result_bytes(event: WorkerResult) -> int:
    """What a result costs: its canonical payload, plus one entry's overhead."""
    return len(canonical_json(event.payload())) + ENTRY_OVERHEAD


def wait_bytes(event: WorkerWaiting) -> int:
    """What a wait costs: its canonical payload (the children it names), plus the
    overhead of the :data:`WAIT_ENTRIES` entries it journals."""
    return len(canonical_json(event.payload())) + WAIT_ENTRIES * ENTRY_OVERHEAD


def spawn_bytes(width: int, workers: Sequence[WorkerSpec]) -> int:
    """What a spawn costs its caller: the worker-chosen bytes of every child's schedule
    (``argv``, ``inputs`` and ``task_class``, as canonical JSON, once per child: one
    spec given for all is journaled in each), plus two entries' overhead (the gate's decision and a
    refusal, when it is refused). The rest of a child's events are of bounded size and
    counted per lease."""
    specs = list(workers) if len(workers) == width else [workers[0]] * width
    return 2 * ENTRY_OVERHEAD + sum(
        len(canonical_json([list(s.argv), list(s.inputs), s.task_class or ""])) for s in specs
    )


def delegate_bytes(inputs: Sequence[str]) -> int:
    """What a delegation costs its caller: the inputs it hands the delegate (journaled
    in the delegate's schedule), plus its request's, its reply's and a refusal's
    overhead (the program is the operator's, declared with the agent)."""
    return 3 * ENTRY_OVERHEAD + len(canonical_json(list(inputs)))


MODEL_CALL_ENTRIES = 3
"""The entries one model call journals: its reservation, and its settlement with the
``UsageRecorded`` that charges its tokens (each fixed-size)."""


def model_call_bytes(event: ModelCallReserved) -> int:
    """What a model call reserved on its own cost: its reservation's canonical payload
    (the model's name is the worker's), plus the overhead of the
    :data:`MODEL_CALL_ENTRIES` entries."""
    return len(canonical_json(event.payload())) + MODEL_CALL_ENTRIES * ENTRY_OVERHEAD


MODEL_BLOCK_ENTRIES = 3
"""The entries one block of tokens journals: its hold, its release, and the
``UsageRecorded`` a recovery charges with it (each fixed-size)."""


def model_block_bytes(event: ModelTokensHeld) -> int:
    """What a block of tokens costs: its hold's canonical payload, plus the overhead
    of the :data:`MODEL_BLOCK_ENTRIES` entries."""
    return len(canonical_json(event.payload())) + MODEL_BLOCK_ENTRIES * ENTRY_OVERHEAD


_DRAWN_ENTRIES = 2  # a drawn call's settlement, and the UsageRecorded charging it
_BIG = 10**19 - 1  # wider than any count a settlement records (its digits, in JSON)
_DRAWN_BASE = len(
    canonical_json(
        ModelCallSettled(
            call="0" * 32, lineage="", block="0" * 32, model="", digest="0" * 64,
            stream_response=False, prompt_estimate=_BIG, max_tokens=_BIG, reserved=_BIG,
            prompt_tokens=_BIG, completion_tokens=_BIG, estimated=False, how="upstream-failed",
            status=_BIG, latency_ms=_BIG, first_token_ms=_BIG,
        ).payload()
    )
)  # fmt: skip


def model_draw_bytes(lineage: str, model: str) -> int:
    """What a call drawn from a block costs (an upper bound): its settlement's
    canonical payload at its widest (the lineage's and model's names are the worker's),
    plus the overhead of its two entries."""
    names = len(canonical_json([lineage, model])) - len(canonical_json(["", ""]))
    return _DRAWN_BASE + names + _DRAWN_ENTRIES * ENTRY_OVERHEAD


class _Budgets(Protocol):
    def record_usage(self, lineage: str, amount: Budget) -> UsageRecorded: ...


class _Cell(Protocol):
    """What the allowance needs of the cell (kept narrow: the cell is being split)."""

    @property
    def budgets(self) -> _Budgets: ...

    @property
    def changed(self) -> threading.Condition: ...

    def refresh(self) -> None: ...


class JournalAllowance:
    """The journal bytes each lease of one cell has caused, and the charge for more."""

    def __init__(
        self,
        cell: _Cell,
        remaining_egress: Callable[[str, int], int],
        record: Callable[[list[Event]], tuple[Committed, ...]],
        *,
        floor: int = FLOOR,
    ) -> None:
        self._cell = cell
        self._remaining_egress = remaining_egress  # (lineage, at_ms) -> bytes (hold lock)
        self._record = record  # appends (fenced, for a cell) and folds what committed
        self.floor = floor
        self._used: dict[str, int] = {}  # bytes charged so far (floor and egress)
        self._egress: dict[str, int] = {}  # of which charged to egress
        self._refused: set[str] = set()  # leases whose refusal is journaled already
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def used(self, lineage: str) -> int:
        """Journal bytes charged to ``lineage`` so far."""
        with self._guard:
            return self._used.get(lineage, 0)

    def egress_charged(self, lineage: str) -> int:
        """Of :meth:`used`, the bytes charged to ``lineage``'s egress axis."""
        with self._guard:
            return self._egress.get(lineage, 0)

    @contextmanager
    def held(self, lineage: str) -> Iterator[None]:
        """Serialise ``lineage``'s charged requests (a worker may hold several
        connections): a charge and the write it pays for are never interleaved with
        another charge of the same lease."""
        with self._guard:
            lock = self._locks.setdefault(lineage, threading.Lock())
        with lock:
            yield

    def charge(self, lineage: str, nbytes: int) -> None:
        """Charge ``nbytes`` of journal to ``lineage`` before they are written (hold
        :meth:`held`): from the floor while it lasts, then from the lease's egress (a
        ``UsageRecorded`` committed now), else refused with the refusal journaled."""
        with self._guard:  # reserved at once: no two charges count from one total
            used = self._used.get(lineage, 0)
            self._used[lineage] = used + nbytes
        over = max(0, used + nbytes - self.floor) - max(0, used - self.floor)
        try:
            if over:
                self._charge_egress(lineage, nbytes, over)
        except JournalAllowanceError:
            with self._guard:  # refused: nothing of it is written
                self._used[lineage] -= nbytes
            raise
        with self._guard:
            self._egress[lineage] = self._egress.get(lineage, 0) + over

    def _charge_egress(self, lineage: str, nbytes: int, over: int) -> None:
        """Charge ``over`` bytes to ``lineage``'s egress (a ``UsageRecorded`` committed
        now), or refuse when its lease does not hold them."""
        with self._cell.changed:
            self._cell.refresh()
            left = self._remaining_egress(lineage, now_ms())
        if left < over:
            self._refuse(lineage, nbytes, over, left)
        amount = Budget(tokens=0, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=over)
        refused = self._cell.budgets.record_usage(lineage, amount).refused
        if refused.egress_bytes:  # spent by a concurrent charge in between
            self._refuse(lineage, nbytes, over, over - refused.egress_bytes)

    def _refuse(self, lineage: str, nbytes: int, over: int, left: int) -> None:
        message = (
            f"{lineage} would make the journal hold {nbytes} more bytes: its lease's "
            f"{self.floor}-byte floor is spent and its egress holds {max(left, 0)} of the "
            f"{over} needed; write less, or spawn with egress to spend on it"
        )
        error = JournalAllowanceError(message)
        with self._guard:
            first = lineage not in self._refused
            self._refused.add(lineage)
        if first:  # once per lease: a flood of refusals journals one
            refusal = BudgetRefused(
                lineage=lineage,
                operation="journal",
                reason=JournalAllowanceError.reason,
                message=message,
            )
            with self._cell.changed:
                self._record([refusal])
        raise error

    def journal_result(
        self, lineage: str, data: bytes, given: Callable[[str], WorkerResult | None]
    ) -> str:
        """Journal ``lineage``'s answer (cut at the cap), charged first: one per worker
        (``given`` says whether it answered already, read under the cell's lock),
        refused when its allowance cannot pay for it."""
        with self.held(lineage):
            self._check_not_given(lineage, given)  # a second result costs nothing more
            data = data[:RESULT_CAP]
            digest = hashlib.sha256(data).hexdigest()
            event = WorkerResult(
                lineage=lineage,
                digest=digest,
                size=len(data),
                text=data.decode("utf-8", errors="replace"),
            )
            self.charge(lineage, result_bytes(event))
            with self._cell.changed:  # checked and journaled together
                self._check_not_given(lineage, given)
                self._record([event])
        return digest

    def _check_not_given(self, lineage: str, given: Callable[[str], WorkerResult | None]) -> None:
        with self._cell.changed:
            self._cell.refresh()
            earlier = given(lineage)
        if earlier is not None:
            raise ResultGivenError(
                f"{lineage} has given its result already (digest {earlier.digest}); a "
                "worker answers once"
            )
