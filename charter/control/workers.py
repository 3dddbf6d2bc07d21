"""Workers as the unit of a fan-out: what each child runs, scheduled in the fan-out's
own append; their lifecycle events; the one vocabulary of a worker's status; and the
cell's journal appends as a command handler (:class:`WorkerLifecycle`).

A spawn may name, for each child, the program it runs (``argv``) and its inputs (extra
arguments appended to ``argv`` when it starts). The fan-out's append then holds one
:class:`WorkerScheduled` per child, next to its grant, lease and slot, so a cell never
runs anything that was not decided and committed with its authority. A fan-out without
workers (the operator's ``charter spawn``) schedules nothing, as before; journals
written before this event existed read unchanged.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

from charter.control.errors import CellSupersededError
from charter.control.handler import Folded, Pinned, append_pinned
from charter.control.resources import AdmissionService, BudgetService, Live
from charter.core import Budget, CharterError, CheckedModel, Lineage, now_ms
from charter.core.events import Event
from charter.core.framing import worker_inputs_digest
from charter.ledger import (
    AppendConflictError,
    AppendFailedError,
    Committed,
    DeadlinePassedError,
    Journal,
    OutcomeUnknownError,
)

__all__ = [
    "LIVE_STATUSES",
    "MAX_ARG_BYTES",
    "MAX_ARGS",
    "RESULT_CAP",
    "CellClaimRenewed",
    "CellStarted",
    "Claim",
    "WorkerEnded",
    "WorkerKilled",
    "WorkerLifecycle",
    "WorkerResult",
    "WorkerScheduled",
    "WorkerSpec",
    "WorkerStarted",
    "CLASS_NAME",
    "CellClass",
    "check_cell_class",
    "Outcome",
    "WorkerStatus",
    "WorkerWaiting",
    "end_outcome",
    "cellrun_stream",
    "inputs_digest",
    "task_class_of",
]

MAX_ARGS = 256
MAX_ARG_BYTES = 16 * 1024

Arg = Annotated[str, StringConstraints(min_length=0, max_length=MAX_ARG_BYTES)]

CLASS_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
"""A cell class (``charter cell run --class NAME``, ``WorkerSpec.cell_class``): a short
lowercase token, a letter then up to 31 letters, digits, ``-`` or ``_``."""


def check_cell_class(name: str) -> str:
    """``name`` when it is a cell class's name; ValueError saying what one is if not."""
    if not CLASS_NAME.fullmatch(name):
        raise ValueError(
            f"a cell class is a short lowercase token (a letter, then up to 31 letters, "
            f"digits, '-' or '_'), not {name[:40]!r}"
        )
    return name


CellClass = Annotated[str, AfterValidator(check_cell_class)]


def inputs_digest(argv: tuple[str, ...], inputs: tuple[str, ...]) -> str:
    """The hex digest of a worker's command, in its own hash domain
    (:func:`charter.core.framing.worker_inputs_digest`: length-prefixed fields, never a
    re-serialisation of a parsed object)."""
    return worker_inputs_digest(argv, inputs).hex()


class WorkerSpec(CheckedModel):
    """What one child runs: an absolute program path with its arguments, and inputs
    appended to them when it starts. No identity: the cell and lineage come from the
    fan-out."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    argv: tuple[Arg, ...] = Field(min_length=1, max_length=MAX_ARGS)
    inputs: tuple[Arg, ...] = Field(default=(), max_length=MAX_ARGS)
    # The class whose baseline supervision holds it against (docs/supervision.md);
    # None: derived from its program (:func:`task_class_of`).
    task_class: str | None = Field(default=None, min_length=1, max_length=200)
    # A test run: its sandbox's egress broker withholds every held credential (journaled,
    # never an empty value), and so do its descendants' (docs/credentials.md).
    dry_run: bool = False
    # The cell it asks to run on (docs/fabric.md): placed there, live or not; None:
    # placed by the fabric's rule (charter/control/placement.py).
    cell: str | None = Field(default=None, min_length=1, max_length=200)
    # The class of cell it needs (docs/fabric.md): placed only on a live cell started
    # with that class (``charter cell run --class NAME``), the fan-out refused when none
    # is live. A requirement, not a placement: a worker may ask one through its door.
    cell_class: CellClass | None = None

    @model_validator(mode="after")
    def _absolute_program(self) -> WorkerSpec:
        if self.cell is not None and self.cell_class is not None:
            raise ValueError(
                "a worker names a cell or asks a class of cell, not both (a named cell is "
                "where it runs, whatever its classes)"
            )
        if not self.argv[0].startswith("/"):
            raise ValueError(
                f"argv[0], a worker's program, must be an absolute path (like "
                f"/usr/bin/python3), not {self.argv[0]!r}"
            )
        if any("\0" in a for a in (*self.argv, *self.inputs)):
            raise ValueError("a worker's argv and inputs cannot hold NUL bytes")
        return self

    @property
    def command(self) -> tuple[str, ...]:
        return (*self.argv, *self.inputs)

    def digest(self) -> str:
        return inputs_digest(self.argv, self.inputs)


class WorkerScheduled(Event):
    """``lineage`` (a child of ``fanout``) runs ``argv + inputs`` on ``cell``, under its
    grant (``grant_digest``) and its lease. Appended with the fan-out's mints, leases
    and slots: all or none. On the worker's own stream, which its cell's lifecycle
    events (start, end, kill) are pinned to, so it can start at most once."""

    type_name = "WorkerScheduled"
    fanout: str
    lineage: str
    cell: str
    argv: tuple[str, ...] = Field(min_length=1)
    inputs: tuple[str, ...] = ()
    inputs_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    grant_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    # Optional so that journals written before task classes stay readable: None reads
    # as the class derived from its program (:attr:`klass`).
    task_class: str | None = None
    # A test run (``charter spawn --dry-run``): every held credential withheld. Left out
    # of the stored payload when false, so journals written before it keep their bytes.
    dry_run: bool = False
    # Its worker asked for this cell (``WorkerSpec.cell``): it stays there, never moved
    # off a gone cell (docs/fabric.md). Left out when false, like ``dry_run``.
    requested: bool = False
    # The class of cell its worker asked (``WorkerSpec.cell_class``): ``cell`` was
    # started with it, and a move off a gone cell goes only to a live one of it. Left
    # out when None.
    cell_class: CellClass | None = None

    @model_serializer(mode="wrap")
    def _without_default_dry_run(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for flag in ("dry_run", "requested", "cell_class"):
                if not data.get(flag):
                    data.pop(flag, None)
        return data

    def stream(self) -> str:
        return worker_stream(self.lineage)

    @property
    def command(self) -> tuple[str, ...]:
        return (*self.argv, *self.inputs)

    @property
    def klass(self) -> str:
        """Its task class: the one it was scheduled with, else its program's name."""
        return self.task_class or task_class_of(self.argv)


def task_class_of(argv: tuple[str, ...]) -> str:
    """The task class of a worker that names none: its program's file name
    (``/usr/bin/python3`` -> ``python3``), or ``default``."""
    name = argv[0].rstrip("/").rpartition("/")[2] if argv else ""
    return name or "default"


def worker_stream(lineage: str) -> str:
    """The stream a worker's schedule and lifecycle go on."""
    return f"worker:{lineage}"


def cellrun_stream(cell: str) -> str:
    """The stream a cell's incarnations go on (its version is the last incarnation)."""
    return f"cellrun:{cell}"


def cellclaim_stream(cell: str) -> str:
    """The stream a cell's claim renewals go on (every incarnation's, in order)."""
    return f"cellclaim:{cell}"


__all__ += ["worker_stream"]

Outcome = Literal[
    "exited", "killed", "timed_out", "oom_killed", "signalled", "failed_to_start", "lost", "failed"
]
"""How a worker ended, derived from what happened (docs/cell.md, "How a worker ends"):
``exited`` (it completed: exited by itself, ``exit_code`` says with what), ``killed``
(a committed ``WorkerKilled``, whoever wrote it, was carried out), ``timed_out`` (its
lease's wall clock or expiry ran out: the sandbox killed it), ``oom_killed`` (its cgroup
killed it for memory), ``signalled`` (it died of signal ``signal``, not sent by the
cell), ``failed_to_start`` (refused before it ran: its lease spent, no custody key, no
sandbox), ``lost`` (its cell lost it: the incarnation that ran it was taken over or its
driver failed before its exit was known). ``failed`` is only read: journals written
before this vocabulary said so of a worker whose driver died."""

WorkerStatus = Literal[
    "queued",
    "admitted",
    "running",
    "waiting",
    "exited",
    "killed",
    "timed_out",
    "oom_killed",
    "signalled",
    "failed_to_start",
    "lost",
    "failed",
]
"""A scheduled worker's status, the one vocabulary of ``charter cell status`` and the
projections (``charter tree``): ``queued`` for a processing slot; ``admitted`` (it holds
one, not started yet); ``running`` (its start is committed); ``waiting`` on its
children (holding a coordination slot instead of a processing one, until it holds a
processing slot again); then how it ended (:attr:`WorkerEnded.outcome`). A started
worker whose cell is gone by time (its claim lapsed) reads as ``lost`` before anyone
journals it so."""

LIVE_STATUSES: tuple[WorkerStatus, ...] = ("queued", "admitted", "running", "waiting")

RESULT_CAP = 64 * 1024
"""The most bytes of a worker's result the journal keeps (the door refuses more)."""


class CellStarted(Event):
    """A cell process began following the journal: ``incarnation`` counts its starts.
    It holds the cell until ``claim_until_ms`` (renewed by :class:`CellClaimRenewed`);
    past the last claim, any reader derives that it is gone. None: written before
    claims existed (no bound: it is gone only once a newer incarnation starts)."""

    type_name = "CellStarted"
    cell: str
    incarnation: int = Field(ge=1)
    pid: int
    host: str
    claim_until_ms: int | None = Field(default=None, ge=0)
    # A live peer cell that found this cell gone by time and took it over only to fail
    # its started workers and move the rest (docs/fabric.md); it runs nothing as this
    # cell and gives the claim up when done. None (left out): the cell itself.
    reaped_by: str | None = None
    # The classes of work this incarnation takes (``charter cell run --class NAME``):
    # a worker asking one is placed only on a live cell that has it (docs/fabric.md).
    # Sorted, no repeats; left out when empty, so journals written before read as none.
    classes: tuple[CellClass, ...] = ()

    @model_validator(mode="after")
    def _classes_sorted_once(self) -> CellStarted:
        if list(self.classes) != sorted(set(self.classes)):
            raise ValueError(f"a cell's classes are sorted, each once: {list(self.classes)}")
        return self

    @model_serializer(mode="wrap")
    def _without_reaper(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            if data.get("reaped_by") is None:
                data.pop("reaped_by", None)
            if not data.get("classes"):
                data.pop("classes", None)
        return data

    def stream(self) -> str:
        return cellrun_stream(self.cell)


class CellClaimRenewed(Event):
    """``incarnation`` of ``cell`` still runs: its claim holds until ``until_ms``.
    Pinned to the run stream as its incarnation left it and committed only before its
    claim lapses, so a lapsed or taken-over incarnation can never renew. On a stream of
    its own (``cellclaim:<cell>``): a renewal moves no pin the incarnation's other
    appends carry, so it never waits on them nor makes them decide again."""

    type_name = "CellClaimRenewed"
    cell: str
    incarnation: int = Field(ge=1)
    until_ms: int = Field(ge=0)

    def stream(self) -> str:
        return cellclaim_stream(self.cell)


class WorkerStarted(Event):
    """The cell took ``lineage`` into sandbox ``sandbox_id`` (committed before exec)."""

    type_name = "WorkerStarted"
    lineage: str
    cell: str
    incarnation: int = Field(ge=1)
    sandbox_id: str

    def stream(self) -> str:
        return worker_stream(self.lineage)


class WorkerWaiting(Event):
    """The worker waits on its children (its processing slot goes back, it holds a
    coordination slot); ``timeout_ms`` after which they are killed."""

    type_name = "WorkerWaiting"
    lineage: str
    children: tuple[str, ...]
    timeout_ms: int = Field(ge=0)

    def stream(self) -> str:
        return worker_stream(self.lineage)


class WorkerResult(Event):
    """The worker's reply, journaled with its digest (sha256 hex of the bytes)."""

    type_name = "WorkerResult"
    lineage: str
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0, le=RESULT_CAP)
    text: str = Field(max_length=RESULT_CAP)

    def stream(self) -> str:
        return worker_stream(self.lineage)


class WorkerKilled(Event):
    """``lineage`` is to be killed, journaled before the kill is sent."""

    type_name = "WorkerKilled"
    lineage: str
    reason: str

    def stream(self) -> str:
        return worker_stream(self.lineage)


T = TypeVar("T")
_SIGNALLED_BASE = 128  # an exit status above it is a death by signal (status - 128)


def end_outcome(
    *, how: str, exit_code: int, oom_kills: int, killed: bool
) -> tuple[Outcome, int | None]:
    """How a worker that ran ended, and the signal it died of (if any), from what its
    sandbox measured: ``how`` (``exited``, ``signalled``, ``wall_clock``,
    ``interrupted``), its exit status, its cgroup's OOM kills, and whether a
    ``WorkerKilled`` of it had committed (then its death is that kill's)."""
    signal = exit_code - _SIGNALLED_BASE if how == "signalled" and exit_code > 128 else None
    if killed or how == "interrupted":
        return "killed", signal
    if how == "wall_clock":
        return "timed_out", None
    if how == "signalled" and oom_kills > 0:
        return "oom_killed", signal
    if how == "signalled":
        return "signalled", signal
    return "exited", None


class WorkerEnded(Event):
    """The worker is over, and how (:data:`Outcome`); ``signal`` for a death by one."""

    type_name = "WorkerEnded"
    lineage: str
    outcome: Outcome
    exit_code: int | None = None
    signal: int | None = Field(default=None, ge=1, le=127)
    sandbox_id: str | None = None
    reason: str = ""

    def stream(self) -> str:
        return worker_stream(self.lineage)


@dataclass(frozen=True)
class Claim:
    """What an incarnation holds its cell by: the run stream's version its start left
    (every append of the incarnation is pinned to it: a newer start moves it), and the
    instant its claim lapses."""

    incarnation: int
    version: int
    until_ms: int


class _Revocations(Protocol):
    def revoked_above(self, lineage: Lineage) -> object | None: ...


class _Views(Folded, Protocol):
    """What a lifecycle needs of the process's views (``charter.control.Views``; named
    by shape: the views import the placement, which imports this module's events)."""

    @property
    def authority(self) -> _Revocations: ...


class WorkerLifecycle:
    """The journal appends of one cell incarnation, as one command handler over the
    process's shared views (the composition root's): each goes through
    :func:`append_pinned` (decided on the views under their lock, pinned to the
    streams it read), and the cell acts only once it has committed. The cell decides
    what to do (its follower) and carries it out (its driver); what is journaled, and
    pinned to what, is decided here.

    **Fencing.** The incarnation holds its cell by a claim (:meth:`begin`, renewed by
    :meth:`renew`); every append of its that decides something (a start, a kill, an
    exit, a result, an end, a settlement) is pinned to the cell's run stream being at
    the version its own last claim left. A newer incarnation's ``CellStarted`` moves
    that stream, so from its position on nothing of the older one commits: the older
    one learns it is fenced (:class:`CellSupersededError`) from its next append. A
    start and a renewal are also refused at or after the claim's lapse (the journal's
    deadline), so an incarnation gone by time never acts again."""

    def __init__(
        self,
        journal: Journal,
        views: _Views,
        budgets: BudgetService,
        admission: AdmissionService,
        cell: str,
        *,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.journal = journal
        self.views = views
        self.budgets = budgets
        self.admission = admission
        self.cell = cell
        self.clock = clock
        self.claim: Claim | None = None
        self._last: Callable[[], tuple[int, int | None]] = lambda: (0, None)

    # -- the claim ---------------------------------------------------------------------

    def begin(
        self,
        pid: int,
        host: str,
        *,
        claim_ms: int,
        last: Callable[[], tuple[int, int | None]],
        take_over: bool = False,
        reaped_by: str | None = None,
        classes: tuple[str, ...] = (),
    ) -> CellStarted | None:
        """Journal the next incarnation of the cell holding a claim for ``claim_ms``,
        pinned to the run stream as read (two processes starting together cannot both
        take it, and a renewal committed meanwhile is seen). ``last()`` gives the last
        incarnation and when its claim lapses (None: no bound). While that claim holds,
        nothing is appended and None is returned (wait for it to lapse), unless
        ``take_over``: then this incarnation fences the last one at once. ``classes``:
        the classes of work it takes (:attr:`CellStarted.classes`)."""
        cell = self.cell
        stream = cellrun_stream(cell)
        claims = cellclaim_stream(cell)
        self._last = last

        def decide(versions: dict[str, int]) -> Pinned | None:
            incarnation, until = last()
            now = self.clock()
            if incarnation and until is not None and now < until and not take_over:
                return None  # held: wait for it to lapse
            started = CellStarted(
                cell=cell,
                incarnation=incarnation + 1,
                pid=pid,
                host=host,
                claim_until_ms=now + claim_ms,
                reaped_by=reaped_by,
                classes=tuple(sorted(set(classes))),
            )
            return Pinned([started], {stream: versions[stream], claims: versions[claims]})

        # A start or a renewal committed meanwhile moves one of them: decided again.
        done = append_pinned(
            self.journal, self.views, [stream, claims], decide, what=f"cell {cell}'s start"
        )
        if done is None:
            return None
        decision, _ = done
        (started,) = decision.events
        if not isinstance(started, CellStarted) or started.claim_until_ms is None:
            raise AppendFailedError(f"cell {cell}'s start journaled {type(started).__name__}")
        self.claim = Claim(started.incarnation, decision.expect[stream] + 1, started.claim_until_ms)
        return started

    def renew(self, claim_ms: int) -> Claim:
        """Extend this incarnation's claim by ``claim_ms`` from now, pinned to its own
        last claim and refused at or after that claim's lapse: raises
        :class:`CellSupersededError` when it was taken over or lapsed first."""
        claim = self._claim()
        stream = cellrun_stream(self.cell)
        until = self.clock() + claim_ms
        renewed = CellClaimRenewed(cell=self.cell, incarnation=claim.incarnation, until_ms=until)
        # Not under the views' lock: a cell ending hundreds of workers holds it for
        # each end's commit, and a renewal queued behind them let the claim lapse (the
        # cell fenced itself). Nothing else pins the claims' stream, so nothing decides
        # on what this moves; the views read the renewal back if it is not folded here.
        try:
            committed = self.journal.append(
                [renewed], expect={stream: claim.version}, deadline_ms=claim.until_ms
            )
        except (AppendConflictError, DeadlinePassedError) as error:
            raise self._fenced(claim, error) from None
        except OutcomeUnknownError:
            # Committed or not: the views, read afresh, say whether the claim now holds
            # is this renewal's.
            with self.views.lock:
                self.views.refresh(self.journal)
                if self._last() != (claim.incarnation, until):
                    raise
            committed = ()
        self.claim = Claim(claim.incarnation, claim.version, until)
        if committed and self.views.lock.acquire(blocking=False):
            try:
                self.views.applied(committed)
            finally:
                self.views.lock.release()
        return self.claim

    def fenced(self) -> bool:
        """Whether another incarnation moved the run stream past this one's claim, or the
        claim lapsed (as the journal stands now); never before it holds one."""
        claim = self.claim
        if claim is None:
            return False
        if self.clock() >= claim.until_ms:
            return True
        return self.journal.stream_version(cellrun_stream(self.cell)) != claim.version

    def _claim(self) -> Claim:
        if self.claim is None:
            raise CellSupersededError("this cell holds no claim: open it first")
        return self.claim

    def pins(self) -> dict[str, int]:
        """The pin on this incarnation's claim (a reaper's moves carry it)."""
        return self._fence()

    def give_up(self) -> None:
        """End this incarnation's claim now (a renewal to now), unless it was fenced or
        lapsed: the next incarnation takes the cell at once."""
        if self.claim is not None:
            with contextlib.suppress(CharterError):
                self.renew(0)

    def _fence(self) -> dict[str, int]:
        """The pin every decision of this incarnation carries (none before it holds a
        claim: a kill journaled then is anyone's, like the CLI's)."""
        claim = self.claim
        return {} if claim is None else {cellrun_stream(self.cell): claim.version}

    def _fenced(self, claim: Claim, error: object) -> CellSupersededError:
        return CellSupersededError(
            f"cell {self.cell}: incarnation {claim.incarnation} is fenced ({error}); it "
            "stops, and whoever takes the cell over fails its workers"
        )

    def _guarded(self, append: Callable[[], T]) -> T:
        """``append()``, with a conflict that the fence explains turned into
        :class:`CellSupersededError` (any other conflict is raised as it is)."""
        try:
            return append()
        except AppendConflictError as error:
            if self.claim is not None and self.fenced():
                raise self._fenced(self.claim, error) from None
            raise

    # -- decisions ---------------------------------------------------------------------

    def chain_versions(self, lineage: str) -> dict[str, int]:
        """The versions of ``lineage``'s stream and every ancestor's, which its start is
        pinned to (read before its caps are decided: a lease returned or a revocation
        committed since makes the start refused, and decided again)."""
        node = Lineage(lineage)
        chain = [str(node), *(str(a) for a in node.ancestors())]
        with self.views.lock:
            return self.journal.stream_versions(chain)  # one read for the whole chain

    def revoked_above(self, lineage: str) -> bool:
        """Whether ``lineage`` or an ancestor is revoked, as the views stand now."""
        with self.views.lock:
            self.views.refresh(self.journal)
            return self.views.authority.revoked_above(Lineage(lineage)) is not None

    def start(
        self,
        lineage: str,
        events: Sequence[Event],
        *,
        chain: dict[str, int],
        tracking: tuple[str, int],
        version: int = 1,
    ) -> bool:
        """Journal a worker's start (``events``) with the follower's ``tracking``
        position, pinned to its schedule being the last entry of its stream, at
        ``version`` (1; more for a worker moved off a gone cell, whose stream holds
        only its schedules), so it starts at most once and never after a kill; to
        this incarnation's claim (a fenced one starts nothing; nor does one past its
        claim's lapse) and to
        ``chain`` (no revocation or lease change above it since). False, with nothing
        appended, when a revocation above it is already folded. A refused append
        raises (``AppendConflictError``, ``AlreadyTrackedError``,
        ``AppendFailedError``, ``DeadlinePassedError``; :class:`CellSupersededError`
        when fenced): no record, no start."""
        claim = self._claim()

        def decide(versions: dict[str, int]) -> Pinned | None:
            del versions
            if self.views.authority.revoked_above(Lineage(lineage)) is not None:
                return None
            expect = {worker_stream(lineage): version, **self._fence(), **chain}
            return Pinned(events, expect, deadline_ms=claim.until_ms, tracking=tracking)

        try:
            done = self._guarded(
                lambda: append_pinned(
                    self.journal, self.views, [], decide, what=f"start of {lineage}", retry_on=()
                )
            )
        except DeadlinePassedError as error:
            raise self._fenced(claim, error) from None
        return done is not None

    def record(self, events: Sequence[Event]) -> tuple[Committed, ...]:
        """Append what this incarnation saw or decided that pins nothing else (a
        sandbox's exit, a result checked under the views' lock, kills journaled before
        they are sent), fenced, and fold it."""

        def append() -> tuple[Committed, ...]:
            with self.views.lock:
                committed = self.journal.append(events, expect=self._fence())
                self.views.applied(committed)
                return committed

        return self._guarded(append)

    def exit(self, lineage: str, exited: Sequence[Event], usage: Budget) -> None:
        """Journal a sandbox's ``exited`` with ``usage`` charged to its worker's lease,
        in one append pinned to the lease's chain and this incarnation's claim. A
        lease that cannot take it (refused, and journaled so; or its streams kept
        moving) leaves the exit to be appended on its own."""
        also = lambda: (exited, self._fence())  # noqa: E731
        try:
            self._guarded(lambda: self.budgets.record_usage(lineage, usage, then=also))
        except (CellSupersededError, OutcomeUnknownError):
            raise  # fenced; or it may have committed: not appended again here
        except CharterError:
            self.record(exited)

    def end(
        self,
        *,
        lineage: str,
        sandbox_id: str | None,
        outcome: Outcome,
        exit_code: int | None,
        reason: str,
        signal: int | None = None,
        discarded: Event | None,
        live: Live,
        ended: Callable[[str], bool],
        exited: Sequence[Event] = (),
        usage: Budget | None = None,
    ) -> None:
        """Journal the end, return the unspent lease, release whichever slot it holds
        and admit whoever queued next, all in one append pinned to the lease's stream,
        the cell's, the worker's own and this incarnation's claim (one commit less per
        worker than returning the lease on its own). ``exited`` (the sandbox's measured
        exit) goes first in whichever append carries the end, and ``usage`` (what the
        worker used) is charged to the lease in the same append as its return: a worker
        with nothing left to wait for is over in one commit. The end is decided again on
        each retry, on the views as they stand: a worker whose end committed meanwhile
        (``ended``: another incarnation failed it, or an end whose outcome was unknown
        did commit) is never ended again, only what it still holds is freed. A lease
        that had ended already is refused (the refusal journaled, for the usage too)
        and the rest is appended without it; one that could not be returned in that
        append (its streams kept moving, or the journal refused it) is charged and
        returned on its own first."""
        events: list[Event] = [
            *exited,
            WorkerEnded(
                lineage=lineage,
                outcome=outcome,
                exit_code=exit_code,
                sandbox_id=sandbox_id,
                reason=reason,
                signal=signal,
            ),
        ]
        if discarded is not None:  # the sandbox's discard, in the same append
            events.append(discarded)
        stream = worker_stream(lineage)

        def ending() -> tuple[list[Event], dict[str, int]]:
            """The end (unless it is in the views already) with the settlement, and the
            pins: the worker's stream read before the views (hold the lock)."""
            version = self.journal.stream_version(stream)
            settled, pins = self.admission.settlement(self.cell, lineage, (), live)
            extra = [] if ended(lineage) else events
            return [*extra, *settled], {**pins, stream: version, **self._fence()}

        with self.views.lock:  # the settlement's pin on the cell's stream holds until it commits
            self.views.refresh(self.journal)
            if ended(lineage):
                self._settle(ending)
                return
            try:
                self._guarded(lambda: self.budgets.release(lineage, then=ending, usage=usage))
            except CellSupersededError:
                raise
            except (AppendConflictError, AppendFailedError):  # nothing written: apart
                if usage is not None:
                    with contextlib.suppress(CharterError):
                        self.budgets.record_usage(lineage, usage)
                with contextlib.suppress(CharterError):
                    self.budgets.release(lineage)
            except OutcomeUnknownError:
                raise  # it may have committed: not decided again
            except CharterError:
                pass  # already ended (expired, or an ancestor's): refused, and journaled so
            else:
                return
        self._settle(ending)

    def settle(self, lineage: str, live: Live) -> None:
        """``lineage``'s slots back and the queue's head admitted, pinned to the cell's
        stream and this incarnation's claim."""

        def settling() -> tuple[list[Event], dict[str, int]]:
            settled, pins = self.admission.settlement(self.cell, lineage, (), live)
            return settled, {**pins, **self._fence()}

        self._settle(settling)

    def _settle(self, decide: Callable[[], tuple[list[Event], dict[str, int]]]) -> None:
        """Append ``decide()``'s settlement, decided again while it loses races on the
        cell (a worker that is gone must not keep its slots counted); fenced."""

        def pinned(versions: dict[str, int]) -> Pinned | None:
            del versions
            events, pins = decide()
            return Pinned(events, pins) if events else None

        self._guarded(
            lambda: append_pinned(
                self.journal, self.views, [], pinned, what=f"settlement on cell {self.cell}"
            )
        )

    def admit_room(self, live: Live) -> bool:
        """Admit queued workers into room no release will announce."""
        if self.fenced():
            raise self._fenced(self._claim(), "its claim moved or lapsed")
        return self.admission.admit_room(self.cell, live)
