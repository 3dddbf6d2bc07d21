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
It speaks JSON-RPC 2.0, one request per line, each line at most ``MAX_FRAME`` bytes.

Methods (docs/door.md): ``spawn`` (a SpawnIntent and the children's workers), ``wait``
(children's results), ``result`` (the worker's reply, size-capped, journaled by digest),
``sign`` (domain-separated, by the worker's own key), ``whoami``. Unknown fields are
refused; a worker cannot name a lineage, a parent or a cell anywhere. Each worker gets
at most ``MAX_REQUESTS`` requests and ``MAX_CONNECTIONS`` connections at a time, so a
flood costs it its own door, not anyone else's.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from charter.authority import SpawnIntent
from charter.control import WorkerSpec
from charter.core import CharterError, RefusedError
from charter.runner.cell import Cell
from charter.runner.errors import NotAWorkerError
from charter.runner.events import RESULT_CAP
from charter.runner.requests import WorkerRequests
from charter.sandbox import KeyBroker, Member, PeerServer, Refusal, SignatureTagError

__all__ = [
    "MAX_CONNECTIONS",
    "MAX_FRAME",
    "MAX_REQUESTS",
    "Door",
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "REFUSED",
    "OVER_LIMIT",
]

MAX_FRAME = 2 * RESULT_CAP + 4096  # a result hex-free as text, plus the envelope
MAX_REQUESTS = 10_000  # per worker, over its whole life
MAX_CONNECTIONS = 4  # per worker at a time (each holds a thread here)
_IDLE_TIMEOUT = 3600.0  # a connection may sit in a long wait

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
REFUSED = -32000
OVER_LIMIT = -32001


class _Params(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SpawnParams(_Params):
    intent: SpawnIntent
    workers: tuple[WorkerSpec, ...] = Field(min_length=1)


class WaitParams(_Params):
    children: tuple[str, ...] = Field(min_length=1, max_length=10_000)
    timeout_s: float = Field(default=600.0, gt=0, le=86_400)


class ResultParams(_Params):
    text: str


class SignParams(_Params):
    tag: str
    message_hex: str = Field(max_length=2 * RESULT_CAP)


class NoParams(_Params):
    pass


_METHODS: dict[str, type[_Params]] = {
    "spawn": SpawnParams,
    "wait": WaitParams,
    "result": ResultParams,
    "sign": SignParams,
    "whoami": NoParams,
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


def _parse(line: bytes) -> tuple[Any, _Params]:
    """One request line: its id and its validated params (unknown fields refused at
    every level: a worker cannot name a lineage, a parent or a cell)."""
    try:
        request = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise _RpcError(PARSE_ERROR, "not JSON") from e
    if not isinstance(request, dict):
        raise _RpcError(INVALID_REQUEST, "a request is a JSON object")
    request_id = request.get("id")
    if request.get("jsonrpc") != "2.0" or set(request) - _ENVELOPE:
        raise _RpcError(
            INVALID_REQUEST, "a JSON-RPC 2.0 request has jsonrpc, id, method, params only",
            request_id=request_id,
        )  # fmt: skip
    model = _METHODS.get(str(request.get("method")))
    if model is None:
        raise _RpcError(
            METHOD_NOT_FOUND, f"no method {request.get('method')!r}", request_id=request_id
        )
    try:
        return request_id, model.model_validate(request.get("params") or {})
    except ValidationError as e:
        raise _RpcError(INVALID_PARAMS, _first_error(e), request_id=request_id) from e


class Door(KeyBroker):
    """The cell's door: a key broker whose socket speaks the worker protocol."""

    def __init__(self, path: Path, *, max_requests: int = MAX_REQUESTS) -> None:
        super().__init__(None)  # keys are held here; the socket is the door's own
        self.path = path
        self.max_requests = max_requests
        self.cell: Cell | None = None
        self._counts: dict[int, int] = {}
        self._count_lock = threading.Lock()
        self._door = PeerServer(
            path, name="door", max_per_uid=MAX_CONNECTIONS, backlog=64,
            member=self._worker, handler=self._serve, refusal=_refused,
        )  # fmt: skip

    def close(self) -> None:
        self._door.close()
        super().close()

    def requests(self, uid: int) -> int:
        """Requests ``uid`` has made so far."""
        with self._count_lock:
            return self._counts.get(uid, 0)

    def _worker(self, uid: int) -> Member | None:
        """On the accepting thread: a peer is served only as a live worker of the cell
        whose sandbox the pool registered here (its uid *and* its cgroup, checked by the
        peer server) and holds its key; the registration's allowance paces it."""
        if self.cell is None or not self.cell.knows_uid(uid):
            return None
        return self._member(uid)

    def _serve(self, conn: socket.socket, uid: int) -> None:
        conn.settimeout(_IDLE_TIMEOUT)
        with contextlib.suppress(OSError), conn.makefile("rb") as reader:
            while True:
                line = reader.readline(MAX_FRAME + 1)
                if not line:
                    return
                if len(line) > MAX_FRAME or not line.endswith(b"\n"):
                    error = _RpcError(INVALID_REQUEST, f"a frame is at most {MAX_FRAME} bytes")
                    conn.sendall(_reply(None, error=error))
                    return  # the rest of an oversized frame is not read: the door closes
                with self._count_lock:
                    count = self._counts[uid] = self._counts.get(uid, 0) + 1
                if count > self.max_requests:
                    error = _RpcError(
                        OVER_LIMIT, f"this worker used its {self.max_requests} requests"
                    )
                    conn.sendall(_reply(None, error=error))
                    return
                conn.sendall(self._handle(line, uid))

    def _handle(self, line: bytes, uid: int) -> bytes:
        request_id: Any = None
        try:
            request_id, params = _parse(line)
            return _reply(request_id, result=self._call(params, uid))
        except _RpcError as e:
            return _reply(e.request_id if e.request_id is not None else request_id, error=e)
        except RefusedError as e:
            return _reply(request_id, error=_RpcError(REFUSED, str(e), {"reason": e.reason}))
        except (CharterError, SignatureTagError) as e:
            return _reply(request_id, error=_RpcError(REFUSED, str(e)))

    def _call(self, params: _Params, uid: int) -> dict[str, Any]:
        cell = self.cell
        if cell is None:
            raise NotAWorkerError("the door is not attached to a cell")
        lineage = cell.lineage_of(uid)  # identity from the kernel, never the request
        requests = WorkerRequests(cell)
        match params:
            case SpawnParams():
                result = requests.spawn(lineage, params.intent, params.workers)
                return {
                    "fanout": result.fanout_id,
                    "children": [str(c.lineage) for c in result.children],
                }
            case WaitParams():
                return {"children": requests.wait(lineage, params.children, params.timeout_s)}
            case ResultParams():
                return {"digest": requests.result(lineage, params.text.encode())}
            case SignParams():
                try:
                    message = bytes.fromhex(params.message_hex)
                except ValueError as e:
                    raise _RpcError(INVALID_PARAMS, "message_hex is not hex") from e
                return {"signature_hex": cell.sign(lineage, params.tag, message).hex()}
            case _:
                return {"lineage": lineage}


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
    return json.dumps(body).encode() + b"\n"


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
