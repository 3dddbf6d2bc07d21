"""The worker door: the one socket a worker reaches Charter through.

A unix socket bound into every worker's sandbox (at the key broker's place,
``/run/charter/keys.sock``: the door *is* the worker's key broker, and more). The door
stays a :class:`~charter.sandbox.KeyBroker` (not a wrapper around one) because the warm
pool binds and registers exactly one key broker per sandbox: the pool registers each
leased sandbox here (host uid, sandbox id, cgroup) and unregisters it when discarded, so
the door's idea of a peer and the key handles issued to it live and die with that one
registration. The peer is identified by the kernel like the brokers' peers: its host uid
(``SO_PEERCRED``) *and* its cgroup (read while ``SO_PEERPIDFD`` shows the pid is still
the peer), so a host process that merely runs as a sandbox's uid is not let in; and
only a live worker of the cell holding its key is served, never by anything the
request says. Admission is paced by the registration's allowance (connections a second).
It speaks JSON-RPC 2.0, one frame per line, each at most ``MAX_FRAME`` bytes: a request,
a notification (executed, never answered) or a batch of at most ``MAX_BATCH``. Every
other frame gets one reply line of valid JSON, whatever it holds (invalid Unicode is a
parse error; an unexpected failure an internal error): no frame ends a thread.

Methods (docs/door.md): ``spawn`` (a SpawnIntent and the children's workers), ``wait``
(children's results), ``result`` (the worker's reply, size-capped, journaled by digest),
``sign`` (domain-separated, by the worker's own key), ``act`` (an outward-acting call,
sent at most once per idempotency key: ``charter.runner._outward``), ``delegate`` (to an
own-sandbox agent, its reply only: docs/delegation.md), ``whoami``. Unknown fields are
refused; a worker cannot name a lineage, a parent or a cell anywhere. Each worker gets
at most ``MAX_REQUESTS`` requests and ``MAX_CONNECTIONS`` connections at a time, so a
flood costs it its own door, not anyone else's. Both belong to the sandbox holding the
peer's uid and the worker in it, never to the bare uid (the pool reuses uids): a frame
is served only while that holder holds the uid, a discarded sandbox's count is dropped
and its connections hung up, and a request still polling the cell (a ``wait``) ends
with ``worker-gone`` when its worker does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import select
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from charter.authority import SpawnIntent
from charter.control import WorkerSpec
from charter.control.outward import OutwardCalls
from charter.core import BadInputError, CharterError, RefusedError
from charter.runner._outward import ActParams, act, request_bytes
from charter.runner.cell import Cell
from charter.runner.errors import ControlPlaneCpuError, NotAWorkerError, WorkerGoneError
from charter.runner.events import RESULT_CAP
from charter.runner.model import ModelDoor, ModelEndpoint, ModelMeter
from charter.runner.requests import WorkerRequests
from charter.sandbox import KeyBroker, Member, PeerServer, Refusal, SignatureTagError

__all__ = [
    "MAX_BATCH",
    "MAX_CONNECTIONS",
    "MAX_FRAME",
    "MAX_REQUESTS",
    "Door",
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "INTERNAL_ERROR",
    "REFUSED",
    "OVER_LIMIT",
    "OVER_CPU",
    "CPU_BASE_S",
    "CPU_MULTIPLE",
    "WorkerGoneError",
]

_log = logging.getLogger(__name__)

MAX_FRAME = 2 * RESULT_CAP + 4096  # a result hex-free as text, plus the envelope
MAX_REQUESTS = 10_000  # per worker (one sandbox), over its whole life
MAX_CONNECTIONS = 4  # per worker at a time (each holds a thread here)
MAX_BATCH = 64  # requests in one batch (each counts against MAX_REQUESTS)
# The door's CPU serving one worker is kept within CPU_MULTIPLE × the worker's own CPU
# (its sandbox's cgroup) + CPU_BASE_S; past it a frame is refused unserved (-32002) and
# the connection closed (so refusals are paced by the connection rate). The base lets a
# worker that has barely started make its first requests. A worker's one result is
# still served past it (``Door._result_past``: one frame parsed per worker at most).
CPU_MULTIPLE = 0.25
CPU_BASE_S = 0.1
_SERVED_KEPT = 1024
_IDLE_TIMEOUT = 3600.0  # a connection may sit in a long wait
_DRAIN_S = 5.0  # how long an unregistering sandbox's connections get to end

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REFUSED = -32000
OVER_LIMIT = -32001
OVER_CPU = -32002


class _Params(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SpawnParams(_Params):
    intent: SpawnIntent
    workers: tuple[WorkerSpec, ...] = Field(min_length=1)

    @field_validator("workers")
    @classmethod
    def _placed_by_the_fabric(cls, workers: tuple[WorkerSpec, ...]) -> tuple[WorkerSpec, ...]:
        # Where a child runs is the control plane's decision (docs/fabric.md): a worker
        # naming a cell could park its children on a dead or made-up one. Only the
        # operator (the CLI, the Python API) may ask for a cell. A class of cell
        # (``cell_class``) is a requirement, not a placement: accepted, and placed by
        # the fabric among the live cells that have it (refused when none does).
        if any(w.cell is not None for w in workers):
            raise ValueError("a worker cannot name the cell its children run on")
        return workers


class WaitParams(_Params):
    children: tuple[str, ...] = Field(min_length=1, max_length=10_000)
    timeout_s: float = Field(default=600.0, gt=0, le=86_400)


class ResultParams(_Params):
    text: str


class SignParams(_Params):
    tag: str
    message_hex: str = Field(max_length=2 * RESULT_CAP)


class SecretParams(_Params):
    name: str = Field(min_length=1, max_length=256)


class RevokeParams(_Params):
    lineage: str = Field(min_length=1, max_length=4096)
    reason: str = Field(default="", max_length=1024)


class DelegateParams(_Params):
    agent: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9-]*$")
    inputs: tuple[str, ...] = Field(default=(), max_length=64)  # checked as argv is
    timeout_s: float = Field(default=600.0, gt=0, le=86_400)


class NoParams(_Params):
    pass


_METHODS: dict[str, type[BaseModel]] = {
    "spawn": SpawnParams,
    "wait": WaitParams,
    "result": ResultParams,
    "sign": SignParams,
    "secret": SecretParams,
    "revoke": RevokeParams,
    "whoami": NoParams,
    "act": ActParams,
    "delegate": DelegateParams,
}


class _RpcError(Exception):
    def __init__(
        self,
        code: int,
        message: str,
        data: dict[str, Any] | None = None,
        request_id: Any = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.data, self.request_id = code, message, data, request_id


_ENVELOPE = frozenset({"jsonrpc", "id", "method", "params"})


class _NonFinite:
    """What ``NaN``, ``Infinity`` or a number too large for a float (``1e400``) parses
    to: no JSON value the door accepts (so never echoed back as an id)."""


_NON_FINITE = _NonFinite()


def _float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NON_FINITE


def _valid_unicode(value: Any) -> bool:
    """True when every string in ``value`` (keys included) is valid Unicode: no lone
    surrogate (``"\\ud800"`` parses to one; it cannot be encoded, journaled or echoed).
    Iterative: ``value`` may be nested as deep as the parser allows."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _load(line: bytes) -> Any:
    """One frame as JSON: strict UTF-8, valid Unicode, numbers a float can hold."""
    try:
        text = line.decode("utf-8")
        loaded = json.loads(text, parse_float=_float, parse_constant=lambda _: _NON_FINITE)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise _RpcError(PARSE_ERROR, "not JSON (UTF-8)") from e
    if not _valid_unicode(loaded):
        raise _RpcError(PARSE_ERROR, "not valid Unicode: a string holds a lone surrogate")
    return loaded


def _valid_id(request_id: Any) -> bool:
    """A JSON-RPC id: a string, an integer, a finite number, or null."""
    if isinstance(request_id, float):
        return math.isfinite(request_id)
    return request_id is None or (
        isinstance(request_id, str | int) and not isinstance(request_id, bool)
    )


class _Request:
    """One validated request object: its id, whether it is a notification (no ``id``
    member: executed, never answered) and its params."""

    def __init__(self, request_id: Any, notification: bool, params: BaseModel) -> None:
        self.request_id, self.notification, self.params = request_id, notification, params


def _parse(request: Any) -> _Request:
    """One request object: its id and its validated params (unknown fields refused at
    every level: a worker cannot name a lineage, a parent or a cell). An invalid
    request (-32600) is answered even without an id (with a null one), as JSON-RPC 2.0
    says; a notification's other errors are not answered."""
    if not isinstance(request, dict):
        raise _RpcError(INVALID_REQUEST, "a request is a JSON object")
    request_id = request.get("id")
    if not _valid_id(request_id):
        raise _RpcError(INVALID_REQUEST, "an id is a string, an integer, a finite number or null")
    if request.get("jsonrpc") != "2.0" or set(request) - _ENVELOPE:
        raise _RpcError(
            INVALID_REQUEST, "a JSON-RPC 2.0 request has jsonrpc, id, method, params only",
            request_id=request_id,
        )  # fmt: skip
    method = request.get("method")
    if not isinstance(method, str):
        raise _RpcError(INVALID_REQUEST, "method is a string", request_id=request_id)
    params = request.get("params", {})
    if not isinstance(params, dict | list):
        raise _RpcError(INVALID_REQUEST, "params is an object or an array", request_id=request_id)
    notification = "id" not in request
    model = _METHODS.get(method)
    if model is None:
        raise _RpcError(METHOD_NOT_FOUND, f"no method {method[:64]!r}", request_id=request_id)
    try:
        return _Request(request_id, notification, model.model_validate(params or {}))
    except ValidationError as e:
        raise _RpcError(INVALID_PARAMS, _first_error(e), request_id=request_id) from e


_Holder = tuple[str, str]
"""Whom a connection serves: the sandbox registered on the peer's uid and the worker the
cell runs in it. Counters and threads belong to the holder, never to the bare uid: a uid
is reused by later sandboxes once the pool wraps."""


class _ScopedCondition:
    """The cell's condition as one request of one holder sees it: every wait checks,
    before and after, that the holder still is (and the door is open), else raises
    :class:`WorkerGoneError` (the lock is given back by the ``with`` it runs in). So a
    request that polls the cell (a ``wait`` queued for a processing slot) ends when its
    worker does, instead of polling for ever."""

    def __init__(self, inner: threading.Condition, holds: Callable[[], bool]) -> None:
        self._inner, self._holds = inner, holds

    def __enter__(self) -> bool:
        return self._inner.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._inner.__exit__(*exc)

    def notify(self, n: int = 1) -> None:
        self._inner.notify(n)

    def notify_all(self) -> None:
        self._inner.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        self._check()
        woken = self._inner.wait(timeout)
        self._check()
        return woken

    def _check(self) -> None:
        if not self._holds():
            raise WorkerGoneError("the worker left its sandbox while its request was served")


class _ScopedCell:
    """The cell, with its ``changed`` condition scoped to one holder (see
    :class:`_ScopedCondition`); everything else is the cell's own."""

    def __init__(self, cell: Cell, holds: Callable[[], bool]) -> None:
        self._cell = cell
        self.changed = _ScopedCondition(cell.changed, holds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cell, name)


class Door(KeyBroker):
    """The cell's door: a key broker whose socket speaks the worker protocol."""

    def __init__(
        self,
        path: Path,
        *,
        max_requests: int = MAX_REQUESTS,
        model_path: Path | None = None,
        endpoint: ModelEndpoint | None = None,
    ) -> None:
        """``model_path``: where the model door (docs/model-door.md) listens, bound into
        each sandbox beside the door; it forwards to ``endpoint`` (None: calls are
        refused as unconfigured)."""
        super().__init__(None)  # keys are held here; the socket is the door's own
        self.path = path
        self.max_requests = max_requests
        self._cell: Cell | None = None
        self.meter: ModelMeter | None = None
        self.outward: OutwardCalls | None = None
        self._closed = False
        self._counts: dict[_Holder, int] = {}  # requests so far, per holder
        self._served: dict[_Holder, float] = {}  # door thread CPU (s) spent, per holder
        self._result_tried: set[_Holder] = set()  # parsed past the CPU allowance once
        # What ended workers cost the door, by lineage (the last _SERVED_KEPT of them).
        self.served_history: OrderedDict[str, float] = OrderedDict()
        self._waiting = threading.local()  # per thread: CPU spent only waiting (s)
        self._serving = threading.local()  # per thread: the connection it serves
        self._conns: dict[socket.socket, _Holder] = {}  # open connections, and whom
        self._count_lock = threading.Lock()
        self._door = PeerServer(
            path, name="door", max_per_uid=MAX_CONNECTIONS, backlog=64,
            member=self._worker, handler=self._serve, refusal=_refused,
        )  # fmt: skip
        self.model: ModelDoor | None = None
        if model_path is not None:
            self.model = ModelDoor(
                model_path, member=self._worker, holder=self._holder,
                meter=lambda: self.meter, endpoint=endpoint,
            )  # fmt: skip
            self.model_path = model_path

    @property
    def cell(self) -> Cell | None:
        return self._cell

    @cell.setter
    def cell(self, cell: Cell | None) -> None:
        """Attach the door to ``cell``: its model calls are metered against the cell's
        leases, and a restarted cell settles the calls its last incarnation left
        unsettled before it returns their leases (``Cell.before_recovered_end``)."""
        self._cell = cell
        self.meter = ModelMeter(cell) if cell is not None else None
        with self._count_lock:
            self.outward = None
        if cell is not None and self.meter is not None:
            # Outward calls (``act``): a restarted cell also records ``unknown`` for the
            # intents its last incarnation left without an outcome, never re-sent.
            meter = self.meter
            cell.before_recovered_end = lambda lineage: (
                meter.recover(lineage),
                self._outward_calls(cell).recover(lineage),
            )

    def _outward_calls(self, cell: Cell) -> OutwardCalls:
        """The cell's outward calls (made at first use: one per attached cell, so its
        in-flight set sees every connection of the cell's workers)."""
        with self._count_lock:
            if self.outward is None:
                self.outward = OutwardCalls(cell.journal, applied=cell.applied, lock=cell.changed)
            return self.outward

    def close(self) -> None:
        self._closed = True
        self._door.close()
        if self.model is not None:
            self.model.close()
        super().close()
        self._hang_up(lambda _: True)

    def stop_answering(self) -> None:
        """The cell is fenced (its ``knows_uid`` now says no to every uid, so no frame is
        answered and no connection accepted): hang up every connection and wait, at
        most ``_DRAIN_S``, until no door thread serves one. The cell kills its sandboxes
        only after this: its door stops answering before they die."""
        self._hang_up(lambda _: True)
        if self.model is not None:
            self.model.hang_up(lambda _: True)
        deadline = time.monotonic() + _DRAIN_S
        while self.connections() and time.monotonic() < deadline:
            time.sleep(0.001)

    def unregister(self, host_uid: int) -> None:
        """The sandbox on ``host_uid`` is discarded: its keys go (the key broker), and
        with it its request count and its connections (shut down: their threads end),
        so a later sandbox on the same uid starts afresh."""
        with self._lock:
            gone = self._sandboxes.get(host_uid)
        super().unregister(host_uid)
        if gone is not None:
            sandbox_id = gone.sandbox_id
            with self._count_lock:
                for holder in [h for h in self._counts if h[0] == sandbox_id]:
                    del self._counts[holder]
            self._hang_up(lambda holder: holder[0] == sandbox_id)
            if self.model is not None:  # its calls settle as their threads end
                self.model.hang_up(lambda holder: holder[0] == sandbox_id)
                self.model.drain(host_uid)
                served = self.model.forget(sandbox_id)
                if self.meter is not None and served is not None:
                    self.meter.finish(served)  # its lease's blocks of tokens end with it
            self._drain(host_uid)
            with self._count_lock:  # after the drain: its threads have stopped adding
                for holder in [h for h in self._served if h[0] == sandbox_id]:
                    self.served_history[holder[1]] = self._served.pop(holder)
                self._result_tried = {h for h in self._result_tried if h[0] != sandbox_id}
                while len(self.served_history) > _SERVED_KEPT:
                    self.served_history.popitem(last=False)

    def _drain(self, uid: int) -> None:
        """Wait (at most ``_DRAIN_S``) until no connection of ``uid`` holds a thread: the
        pool releases the uid only after unregistering it, so the next sandbox on the
        uid finds its connection allowance whole. A thread stuck past the bound (in a
        slow journal append) ends at its next wait or frame; the uid is not held up
        for it."""
        deadline = time.monotonic() + _DRAIN_S
        while self._door.active(uid) and time.monotonic() < deadline:
            time.sleep(0.001)

    def _hang_up(self, which: Callable[[_Holder], bool]) -> int:
        """Shut down the connections whose holder ``which`` picks (their threads see the
        end of the stream, or a gone worker at their next wait); returns how many."""
        with self._count_lock:
            conns = [c for c, holder in self._conns.items() if which(holder)]
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        return len(conns)

    def served_cpu_s(self, uid: int) -> float:
        """CPU (s) the door's threads have spent serving the sandbox now on ``uid``."""
        holder = self._holder(uid)
        with self._count_lock:
            return self._served.get(holder, 0.0) if holder is not None else 0.0

    def requests(self, uid: int) -> int:
        """Requests the sandbox now on ``uid`` has made so far."""
        holder = self._holder(uid)
        with self._count_lock:
            return self._counts.get(holder, 0) if holder is not None else 0

    def active(self, host_uid: int) -> int:
        """Connections from ``host_uid`` that hold a door thread now."""
        return self._door.active(host_uid)

    def connections(self) -> int:
        """Connections being served now (each holds a thread)."""
        with self._count_lock:
            return len(self._conns)

    def _holder(self, uid: int) -> _Holder | None:
        """The sandbox registered on ``uid`` and the cell's worker in it (None when
        either is missing, or the door is closed)."""
        cell = self.cell
        if self._closed or cell is None or not cell.knows_uid(uid):
            return None
        with self._lock:
            sandbox = self._sandboxes.get(uid)
        if sandbox is None:
            return None
        try:
            return (sandbox.sandbox_id, cell.lineage_of(uid))
        except NotAWorkerError:
            return None

    def _worker(self, uid: int) -> Member | None:
        """On the accepting thread: a peer is served only as a live worker of the cell
        whose sandbox the pool registered here (its uid *and* its cgroup, checked by the
        peer server) and holds its key; the registration's allowance paces it."""
        if self._closed or self.cell is None or not self.cell.knows_uid(uid):
            return None
        return self._member(uid)

    def _serve(self, conn: socket.socket, uid: int) -> None:
        holder = self._holder(uid)
        if holder is None:  # gone between the accept and this thread
            gone = _RpcError(REFUSED, _REFUSALS["unknown"], {"reason": NotAWorkerError.reason})
            with contextlib.suppress(OSError):
                conn.sendall(_reply(None, error=gone))
            return
        with self._count_lock:
            self._conns[conn] = holder
        self._serving.conn = conn
        try:
            conn.settimeout(_IDLE_TIMEOUT)
            with contextlib.suppress(OSError), conn.makefile("rb") as reader:
                while self._serve_frame(conn, reader, uid, holder):
                    pass
        finally:
            with self._count_lock:
                self._conns.pop(conn, None)

    def _serve_frame(self, conn: socket.socket, reader: Any, uid: int, holder: _Holder) -> bool:
        """Read one frame and answer it, the CPU it takes charged to ``holder``; False
        when the connection is to close."""
        start, waited = time.thread_time(), self._waiting.__dict__.get("s", 0.0)
        try:
            return self._answer_frame(conn, reader, uid, holder)
        finally:
            spent = time.thread_time() - start - (self._waiting.__dict__.get("s", 0.0) - waited)
            with self._count_lock:
                self._served[holder] = self._served.get(holder, 0.0) + spent

    @contextlib.contextmanager
    def _uncharged(self) -> Iterator[None]:
        """What a request does while it only waits (polling for its children's ends, or
        for a processing slot) is left out of the CPU charged to its worker: bounded by
        the wait's timeout, at one refresh per change of the cell or per 50 ms."""
        start = time.thread_time()
        try:
            yield
        finally:
            self._waiting.s = self._waiting.__dict__.get("s", 0.0) + time.thread_time() - start

    def _within_cpu(self, uid: int, holder: _Holder) -> bool:
        """Whether the door's CPU for ``holder`` so far is within its allowance: a
        multiple of the worker's own CPU, plus the base (its cgroup read only once the
        base is spent)."""
        with self._count_lock:
            served = self._served.get(holder, 0.0)
        if served <= CPU_BASE_S:
            return True
        return served <= CPU_BASE_S + CPU_MULTIPLE * self.sandbox_cpu_s(uid)

    def _result_past(self, line: bytes, holder: _Holder) -> dict[str, Any] | None:
        """The frame past ``holder``'s CPU allowance, loaded, where it is the one a worker
        may still send: a single ``result`` request (served, then refused as any second
        result is). Only the first frame past the allowance that names ``"result"`` is
        parsed, once per worker, whatever it turns out to be; None otherwise (refused
        unparsed)."""
        if b'"result"' not in line:
            return None
        with self._count_lock:
            if holder in self._result_tried:
                return None
            self._result_tried.add(holder)
        try:
            loaded = _load(line)
        except _RpcError:
            return None
        if isinstance(loaded, dict) and loaded.get("method") == "result":
            return loaded
        return None

    def _answer_frame(self, conn: socket.socket, reader: Any, uid: int, holder: _Holder) -> bool:
        line = reader.readline(MAX_FRAME + 1)
        if not line:
            return False
        if len(line) > MAX_FRAME or not line.endswith(b"\n"):
            error = _RpcError(INVALID_REQUEST, f"a frame is at most {MAX_FRAME} bytes")
            conn.sendall(_reply(None, error=error))
            return False  # the rest of an oversized frame is not read: the door closes
        if self._holder(uid) != holder:  # the worker ended; its uid may hold another
            left = WorkerGoneError("the worker this connection served has ended")
            conn.sendall(_reply(None, error=_refusal(left)))
            return False
        exempt = None  # past the allowance, a worker's one result is still served
        if (
            not self._within_cpu(uid, holder)
            and (exempt := self._result_past(line, holder)) is None
        ):
            over = ControlPlaneCpuError(
                f"the door has spent more than {CPU_MULTIPLE} x this worker's own CPU "
                f"+ {CPU_BASE_S} s serving it; retry once it has worked more"
            )
            conn.sendall(
                _reply(None, error=_RpcError(OVER_CPU, str(over), {"reason": over.reason}))
            )
            return False
        try:
            loaded = _load(line) if exempt is None else exempt
        except _RpcError as e:
            loaded, reply = None, _reply(None, error=e)
        else:
            reply = b""
        batch = loaded if isinstance(loaded, list) else None
        if not self._take(holder, len(batch) if batch else 1):
            error = _RpcError(OVER_LIMIT, f"this worker used its {self.max_requests} requests")
            conn.sendall(_reply(None, error=error))
            return False
        gone = False
        if reply:
            conn.sendall(reply)
        elif batch is None:
            reply, gone = self._respond(loaded, uid, holder)
            conn.sendall(reply)
        elif not batch or len(batch) > MAX_BATCH:
            error = _RpcError(INVALID_REQUEST, f"a batch holds 1 to {MAX_BATCH} requests")
            conn.sendall(_reply(None, error=error))
        else:
            replies = [self._respond(request, uid, holder) for request in batch]
            gone = any(g for _, g in replies)
            answered = [r.rstrip(b"\n") for r, _ in replies if r]
            if answered:  # a batch of notifications only is not answered at all
                conn.sendall(b"[" + b",".join(answered) + b"]\n")
        return not gone  # its worker left while a request was served: hang up

    def _take(self, holder: _Holder, n: int) -> bool:
        with self._count_lock:
            count = self._counts[holder] = self._counts.get(holder, 0) + n
        return count <= self.max_requests

    def _respond(self, request: Any, uid: int, holder: _Holder) -> tuple[bytes, bool]:
        """One request object's reply line (empty for a notification), and whether its
        worker turned out gone while it was served (the connection then hangs up).
        Never raises: whatever goes wrong is an error reply, and the connection goes
        on."""
        parsed: _Request | None = None
        try:
            parsed = _parse(request)
            result = self._call(parsed.params, uid, holder)
            return b"" if parsed.notification else _reply(parsed.request_id, result=result), False
        except _RpcError as e:
            if e.code != INVALID_REQUEST and "id" not in request:  # request is a dict here
                return b"", False  # a notification's error is not answered
            return _reply(e.request_id, error=e), False
        except (RefusedError, CharterError, SignatureTagError) as e:
            error = _refusal(e)
        except Exception:  # noqa: BLE001 (every request is answered; no thread dies)
            _log.exception("the door failed to serve a request of %s", holder[1])
            error = _RpcError(INTERNAL_ERROR, "the door failed to serve this request")
        gone = error.data == {"reason": WorkerGoneError.reason}
        if parsed is None or parsed.notification:
            return b"", gone
        return _reply(parsed.request_id, error=error), gone

    def _call(  # noqa: PLR0911 (one return per method)
        self, params: BaseModel, uid: int, holder: _Holder
    ) -> dict[str, Any]:
        cell = self.cell
        if cell is None:
            raise NotAWorkerError("the door is not attached to a cell")
        lineage = holder[1]  # identity from the kernel, never the request
        scoped = _ScopedCell(cell, lambda: self._holder(uid) == holder)
        requests = WorkerRequests(cast(Cell, scoped), uncharged=self._uncharged)
        if isinstance(params, SecretParams):  # every name refused; a decoy's a touch
            cell.secret(lineage, params.name)
        match params:
            case SpawnParams():
                cell.door_call(lineage, "spawn", params.intent.width)  # for supervision
                workers = _test_run_children(cell, lineage, params.workers)
                result = requests.spawn(lineage, params.intent, workers)
                return {
                    "fanout": result.fanout_id,
                    "children": [str(c.lineage) for c in result.children],
                    "position": result.positions[1],  # its commit's last entry
                }
            case WaitParams():
                children = requests.wait(lineage, params.children, params.timeout_s)
                # the cell's view has folded the children's ends: the answer's position
                return {"children": children, "position": cell.view.position}
            case ResultParams():
                cell.door_call(lineage, "result", len(params.text.encode()))
                return {"digest": requests.result(lineage, params.text.encode())}
            case RevokeParams():
                position = requests.revoke(lineage, params.lineage, params.reason)
                return {"lineage": params.lineage, "revoked": True, "position": position}
            case SignParams():
                cell.door_call(lineage, "sign", 0)
                try:
                    message = bytes.fromhex(params.message_hex)
                except ValueError as e:
                    raise _RpcError(INVALID_PARAMS, "message_hex is not hex") from e
                return {"signature_hex": cell.sign(lineage, params.tag, message).hex()}
            case ActParams():
                return self._act(cell, uid, lineage, params)
            case DelegateParams():
                conn = self._serving.conn
                return requests.delegate(
                    lineage, params.agent, params.inputs, params.timeout_s,
                    stopped=lambda: _hung_up(conn),
                )  # fmt: skip
            case _:
                return {"lineage": lineage}

    def _act(self, cell: Cell, uid: int, lineage: str, params: ActParams) -> dict[str, Any]:
        """An outward-acting call (``charter.runner._outward``), at most once per key."""
        try:
            built = request_bytes(params)
        except BadInputError as e:
            raise _RpcError(INVALID_PARAMS, str(e)) from e
        broker = cell.egress_broker
        calls = self._outward_calls(cell)
        return act(calls, cell.journal_allowance, broker, uid, lineage, params, built)


def _hung_up(conn: socket.socket) -> bool:
    """Whether the peer closed ``conn`` (its caller stopped waiting): readable, and a
    peek finds the end of the stream (a pipelined request is not an end)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):  # reset, or closed here: nobody is waiting
        return True


def _test_run_children(
    cell: Cell, lineage: str, workers: tuple[WorkerSpec, ...]
) -> tuple[WorkerSpec, ...]:
    """A test run's children are test runs too (every held credential withheld down
    its tree); anyone else's as asked (a worker may make its own children test runs)."""
    record = cell.workers([lineage]).get(lineage)
    if record is None or not record.scheduled.dry_run:
        return workers
    return tuple(w.model_copy(update={"dry_run": True}) for w in workers)


def _refusal(e: Exception) -> _RpcError:
    if isinstance(e, RefusedError):
        return _RpcError(REFUSED, str(e), {"reason": e.reason})
    return _RpcError(REFUSED, str(e))


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(x) for x in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


def _reply(request_id: Any, *, result: Any = None, error: _RpcError | None = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    if error is None:
        body["result"] = result
    else:
        body["error"] = {"code": error.code, "message": error.message}
        if error.data is not None:
            body["error"]["data"] = error.data
    try:
        return json.dumps(body, allow_nan=False).encode() + b"\n"
    except (TypeError, ValueError):  # never an invalid JSON reply
        error = _RpcError(INTERNAL_ERROR, "the door could not encode its reply")
        return _reply(request_id if _valid_id(request_id) else None, error=error)


_REFUSALS: dict[Refusal, str] = {
    "unknown": "this peer is not a live worker of this cell",
    "outside": "this process is not inside the worker's sandbox",
    "over-rate": "over this worker's connection rate; retry later",
    "at-cap": f"at most {MAX_CONNECTIONS} connections per worker",
    "busy": "the door is busy",
}


def _refused(uid: int, why: Refusal) -> bytes:
    del uid
    return _reply(
        None,
        error=_RpcError(REFUSED if why in ("unknown", "outside") else OVER_LIMIT, _REFUSALS[why]),
    )
