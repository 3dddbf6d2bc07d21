"""The model door: an OpenAI-compatible endpoint every worker reaches from its sandbox,
metered against its lease's tokens (docs/model-door.md).

A unix socket bound into every sandbox at ``/run/charter/model.sock``
(``CHARTER_MODEL_SOCKET``), beside the door's, speaking HTTP/1.1 (h11):
``POST /v1/chat/completions`` and ``POST /v1/responses`` (the Responses shape), streamed
(``"stream": true``, server-sent events) or not. The peer is identified exactly as at
the door (its host uid and cgroup, by the kernel; the door's registration and
connection allowance), and the call forwarded to the one endpoint the operator
configured (``charter model configure``) with the API key Charter holds: no key is ever
in a sandbox.

Each call, in order:

1. its reservation, ``ceil(body bytes / 4)`` (the prompt's estimate) + ``max_tokens``
   (``max_output_tokens``; the worker's, else :data:`DEFAULT_MAX_TOKENS` cut to what is
   left), is checked against the lease's tokens left net of the worker's calls in
   flight, under the lease's lock, and journaled (``ModelCallReserved``) **before**
   anything is sent; a lease that cannot cover it is refused (429, ``model-tokens``,
   journaled once per lease as ``ModelCallRefused``);
2. the call is sent with ``max_tokens`` set to the reservation's (and, a streamed chat
   completion, ``stream_options.include_usage``); a stream whose counted tokens (one per
   content chunk or delta event) pass it is cut;
3. it is settled once, in one append: ``UsageRecorded`` (tokens) and
   ``ModelCallSettled``, pinned to the call's stream so a second settlement cannot
   commit, from the server's reported usage, or as an estimate flagged so (cut at the
   cap, client gone, no usage, server failed, or the cell restarted: ``recover``). The
   settlement is decided when the answer ends and rides in the same connection's next
   reservation (one commit for both); without one within :data:`SETTLE_DELAY_S`, before
   a refusal, or as the connection ends, it is appended alone.

A worker's end waits for its calls to settle: the door's ``unregister`` (before the cell
returns the lease) hangs up the model connections of the sandbox and waits for their
threads, which settle as they end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import h11

from charter.core import BadInputError, Budget, CharterError, Event, now_ms
from charter.runner._journal_allowance import model_call_bytes
from charter.runner._sse import data_of, event_batches
from charter.runner._upstream import (
    Answer,
    UpstreamConnection,
    request_head,
)
from charter.runner.errors import (
    ModelCallSettledError,
    ModelNotConfiguredError,
    ModelRequestError,
    ModelTokensError,
)
from charter.runner.events import (
    MODEL_NAME_CAP,
    ModelCallRefused,
    ModelCallReserved,
    ModelCallSettled,
    model_call_stream,
)
from charter.sandbox import Member, PeerServer, Refusal

__all__ = [
    "BYTES_PER_TOKEN",
    "DEFAULT_MAX_TOKENS",
    "JOURNAL_BLOCK",
    "MAX_BODY",
    "MAX_CONNECTIONS",
    "ModelDoor",
    "ModelEndpoint",
    "ModelMeter",
    "SETTLE_DELAY_S",
    "Settlement",
    "configure_endpoint",
    "load_endpoint",
    "prompt_estimate",
]

_log = logging.getLogger(__name__)

BYTES_PER_TOKEN = 4
"""The prompt's estimate: one token per 4 bytes of the request body, rounded up."""
DEFAULT_MAX_TOKENS = 1024
"""``max_tokens`` when a worker names none (cut to what its lease has left)."""
MAX_BODY = 4 * 1024 * 1024  # a request body (the prompt) the door reads
MAX_RESPONSE = 16 * 1024 * 1024  # a non-streamed answer the door relays
MAX_CONNECTIONS = 16  # per worker at a time (each holds a thread here)
JOURNAL_BLOCK = 32 * 1024
"""Journal bytes the model door charges a lease's allowance at a time (docs/door.md)."""
_IDLE_TIMEOUT = 300.0  # a model may think for minutes before its first byte
SETTLE_DELAY_S = 0.05
"""How long an answered call's settlement waits for the connection's next reservation
to carry it (one commit for both) before it is appended on its own."""
_DRAIN_S = 5.0
_KEPT = 16  # idle connections kept to the model endpoint
_ENDPOINT_FILE = "model-endpoint.json"
_KEY_FILE = "model-api-key"

SettleHow = Literal["usage", "cut-at-cap", "client-gone", "upstream-failed", "no-usage"]


# -- configuration -----------------------------------------------------------------


@dataclass(frozen=True)
class ModelEndpoint:
    """The operator's model endpoint: its base URL (``https://api.example.com/v1``,
    ``http://127.0.0.1:8000/v1``) and the API key Charter holds for it (never shown)."""

    url: str
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadInputError(f"model endpoint {self.url!r}: an http(s) URL with a host")


def configure_endpoint(home: Path, url: str, key_file: Path | None) -> Path:
    """Keep ``url`` and the key read from ``key_file`` in the home (``model-endpoint.json``
    and ``model-api-key``, mode 0600): the one place a cell's model door reads them."""
    endpoint = ModelEndpoint(url)  # validated before anything is written
    home.mkdir(parents=True, exist_ok=True)
    key_path = home / _KEY_FILE
    if key_file is not None:
        key = key_file.read_text().strip()
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(key + "\n")
        key_path.chmod(0o600)
    else:
        key_path.unlink(missing_ok=True)
    path = home / _ENDPOINT_FILE
    path.write_text(json.dumps({"url": endpoint.url}) + "\n")
    return path


def load_endpoint(home: Path) -> ModelEndpoint | None:
    """The endpoint configured in ``home``, or None."""
    try:
        url = json.loads((home / _ENDPOINT_FILE).read_text())["url"]
    except FileNotFoundError:
        return None
    key_path = home / _KEY_FILE
    key = key_path.read_text().strip() if key_path.exists() else None
    return ModelEndpoint(url, key)


# -- the request ---------------------------------------------------------------------


def prompt_estimate(body: bytes) -> int:
    """The prompt's tokens as the reservation counts them: ``ceil(len(body) / 4)``."""
    return math.ceil(len(body) / BYTES_PER_TOKEN)


Api = Literal["chat", "responses"]
_PATHS: dict[str, Api] = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/responses": "responses",
    "/responses": "responses",
}
_UPSTREAM: dict[Api, str] = {"chat": "/chat/completions", "responses": "/responses"}


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion (or a Responses call) as the worker sent it, checked enough to
    meter it."""

    body: bytes
    fields: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int | None
    max_key: str  # "max_tokens", "max_completion_tokens" or "max_output_tokens"
    include_usage: bool  # a Responses stream always reports its usage
    api: Api = "chat"

    @classmethod
    def parse(cls, body: bytes, api: Api = "chat") -> ChatRequest:
        try:
            fields = json.loads(body)
        except ValueError as e:
            raise ModelRequestError("the request body is not JSON") from e
        if api == "responses":
            if not isinstance(fields, dict) or not isinstance(fields.get("input"), str | list):
                raise ModelRequestError("a response is a JSON object with input")
        elif not isinstance(fields, dict) or not isinstance(fields.get("messages"), list):
            raise ModelRequestError("a chat completion is a JSON object with messages")
        model = fields.get("model", "")
        if not isinstance(model, str) or len(model) > MODEL_NAME_CAP:
            raise ModelRequestError(f"model is a string of at most {MODEL_NAME_CAP} characters")
        stream = fields.get("stream", False)
        if not isinstance(stream, bool):
            raise ModelRequestError("stream is true or false")
        if api == "responses":
            key = "max_output_tokens"
        else:
            key = "max_completion_tokens" if "max_completion_tokens" in fields else "max_tokens"
        max_tokens = fields.get(key)
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise ModelRequestError(f"{key} is a positive integer")
        options = fields.get("stream_options") or {}
        include = isinstance(options, dict) and options.get("include_usage") is True
        return cls(body, fields, model, stream, max_tokens, key, include or api == "responses", api)

    def upstream_body(self, max_tokens: int) -> bytes:
        fields = dict(self.fields)
        fields[self.max_key] = max_tokens
        if self.stream and self.api == "chat":
            options = dict(fields.get("stream_options") or {})
            options["include_usage"] = True
            fields["stream_options"] = options
        return json.dumps(fields).encode()


# -- reservation and settlement ----------------------------------------------------


@dataclass
class Settlement:
    """A call's settlement, decided when its answer ended: journaled once (``done``
    once it was tried; ``committed`` once it is on record)."""

    reserved: ModelCallReserved
    event: ModelCallSettled
    done: bool = False
    committed: bool = False

    @classmethod
    def of(
        cls,
        reserved: ModelCallReserved,
        prompt: int,
        completion: int,
        *,
        estimated: bool,
        how: SettleHow | Literal["recovered"],
        status: int,
        latency_ms: int,
        first_token_ms: int | None = None,
    ) -> Settlement:
        event = ModelCallSettled(
            call=reserved.call,
            lineage=reserved.lineage,
            prompt_tokens=prompt,
            completion_tokens=completion,
            estimated=estimated,
            how=how,
            status=status,
            latency_ms=latency_ms,
            first_token_ms=first_token_ms,
        )
        return cls(reserved, event)


class ModelMeter:
    """Reservations of one cell's model calls against their leases' tokens, and their
    settlement (docs/model-door.md)."""

    def __init__(self, cell: Any) -> None:
        self._cell = cell
        self._inflight: dict[str, int] = {}  # lineage -> tokens reserved, not settled
        self._refused: set[tuple[str, str]] = set()  # (lineage, reason) journaled once
        self._prepaid: dict[str, int] = {}  # journal bytes charged, not yet used
        self._guard = threading.Lock()

    def in_flight(self, lineage: str) -> int:
        with self._guard:
            return self._inflight.get(lineage, 0)

    def reserve(
        self, lineage: str, request: ChatRequest, after: Settlement | None = None
    ) -> ModelCallReserved:
        """Hold the call's tokens against ``lineage``'s lease (net of its calls in
        flight) and journal the reservation, or refuse (journaled once per lease).

        ``after``, an answered call of the same lease not yet settled (the connection's
        previous one), is settled first, in the reservation's own append when it can be
        (one commit for both), else on its own: always exactly once, whether this call
        is reserved or refused. Its tokens, not its reservation, count against this one."""
        try:
            return self._reserve(lineage, request, after)
        finally:
            if after is not None and not after.done:
                self.settle(after)

    def _reserve(
        self, lineage: str, request: ChatRequest, after: Settlement | None
    ) -> ModelCallReserved:
        cell = self._cell
        estimate = prompt_estimate(request.body)
        allowance = cell.journal_allowance
        with allowance.held(lineage):  # one reservation of a lease at a time
            with cell.changed:
                cell.refresh()
                remaining = cell.resources.book.remaining(lineage, now_ms())
            tokens = remaining.tokens
            left = tokens - self.in_flight(lineage)
            if after is not None:  # settled before this one: its charge, not its hold
                assert after.reserved.lineage == lineage
                left += after.reserved.reserved - after.event.prompt_tokens
                left -= after.event.completion_tokens
            max_tokens = request.max_tokens
            if max_tokens is None:
                max_tokens = min(DEFAULT_MAX_TOKENS, left - estimate)
            need = estimate + max(max_tokens, 1)
            if max_tokens < 1 or need > left:
                self._refuse(
                    lineage,
                    ModelTokensError(
                        f"{lineage}'s lease has {max(left, 0)} tokens left (net of its calls "
                        f"in flight); this call reserves {need} (a prompt of about "
                        f"{estimate} and max_tokens {max(max_tokens, 1)}): ask for fewer "
                        "max_tokens, or spawn with more tokens"
                    ),
                    need,
                    left,
                )
            reserved = ModelCallReserved(
                call=uuid.uuid4().hex,
                lineage=lineage,
                cell=cell.cell,
                model=request.model,
                digest=hashlib.sha256(request.body).hexdigest(),
                stream_response=request.stream,
                prompt_estimate=estimate,
                max_tokens=max_tokens,
                reserved=need,
            )
            self._charge_journal(lineage, model_call_bytes(reserved), remaining.egress_bytes)
            with self._guard:  # held before the append: never counted from one total twice
                self._inflight[lineage] = self._inflight.get(lineage, 0) + need
            try:
                carried = after is not None and self._commit(after, carry=reserved)
                if not carried:  # its stream is new: pinned at 0, never read first
                    with cell.changed:
                        fresh = {reserved.stream(): 0}
                        cell.applied(cell.journal.append([reserved], expect=fresh))
            except BaseException:
                self._release(lineage, need)  # not journaled: nothing is sent
                raise
        return reserved

    def _charge_journal(self, lineage: str, nbytes: int, egress_left: int) -> None:
        """Charge a call's journal bytes to the lease's journal allowance (hold its
        lock): from what was prepaid, else prepaying :data:`JOURNAL_BLOCK` bytes at
        once when the lease's egress covers it (past the floor that is one egress
        charge for about twenty calls, not one each; at most a block is charged and
        never journaled), else exactly ``nbytes`` (refused, and journaled, when the
        allowance cannot pay even that)."""
        with self._guard:
            prepaid = self._prepaid.get(lineage, 0)
        if prepaid < nbytes:
            allowance = self._cell.journal_allowance
            used, floor = allowance.used(lineage), allowance.floor
            block = max(JOURNAL_BLOCK, nbytes)
            over = max(0, used + block - floor) - max(0, used - floor)
            charge = block if over <= egress_left else nbytes
            allowance.charge(lineage, charge)
            prepaid += charge
        with self._guard:
            self._prepaid[lineage] = prepaid - nbytes

    def refuse_unconfigured(self, lineage: str) -> None:
        self._refuse(
            lineage,
            ModelNotConfiguredError(
                "no model endpoint is configured for this cell (`charter model configure "
                "--url URL --key-file FILE`); nothing was sent"
            ),
            0,
            0,
        )

    def _refuse(self, lineage: str, error: CharterError, need: int, left: int) -> None:
        reason = getattr(error, "reason", "refused")
        with self._guard:
            first = (lineage, reason) not in self._refused
            self._refused.add((lineage, reason))
        if first:  # once per lease and reason: a flood of refusals journals one
            refusal = ModelCallRefused(
                lineage=lineage, reason=reason, message=str(error), needed=need, left=left
            )
            with self._cell.changed:
                self._cell.applied(self._cell.journal.append([refusal]))
        raise error

    def settle(self, pending: Settlement) -> ModelCallSettled | None:
        """Charge the call's tokens and journal its settlement in one append, on its
        own, pinned to the call's stream (None when it was settled already, by this door
        or a later incarnation's recovery: never twice). The reservation is given back
        only after the charge commits."""
        if pending.done:
            return None
        self._commit(pending)
        return pending.event if pending.committed else None

    def _commit(self, pending: Settlement, carry: ModelCallReserved | None = None) -> bool:
        """Settle ``pending`` (once: it is ``done`` after this, whatever happened), with
        ``carry`` in the same append when the charge commits; whether it was carried.
        The reservation is given back only after the charge commits."""
        if pending.done:  # tried once already: never charged (or given back) twice
            return False
        reserved, settled = pending.reserved, pending.event
        pending.done = True
        stream = model_call_stream(reserved.call)
        journal = self._cell.journal
        extra: list[Event] = [] if carry is None else [carry]
        # The carried reservation's stream is new (a fresh call id): pinned at 0, so
        # the append does not read its version first.
        pins = {stream: 1} if carry is None else {stream: 1, carry.stream(): 0}
        tries = 0

        def also() -> tuple[list[Event], dict[str, int]]:
            # Pinned to the stream being at its reservation: the first try assumes so
            # (a settled call's pin conflicts, and the retry reads it and stops).
            nonlocal tries
            tries += 1
            if tries > 1 and journal.stream_version(stream) != 1:
                raise ModelCallSettledError(f"model call {reserved.call} is settled already")
            return [settled, *extra], pins

        tokens = settled.prompt_tokens + settled.completion_tokens
        amount = Budget(tokens=tokens, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)
        try:
            self._cell.budgets.record_usage(reserved.lineage, amount, then=also)
        except ModelCallSettledError:
            return False
        except CharterError:
            # The lease ended first (its refusal is journaled): the call is still
            # settled, so its tokens are on record, charged or not.
            with contextlib.suppress(CharterError), self._cell.changed:
                if journal.stream_version(stream) == 1:
                    self._cell.applied(journal.append([settled], expect={stream: 1}))
            pending.committed = True
            return False
        else:
            pending.committed = True
            return carry is not None
        finally:
            self._release(reserved.lineage, reserved.reserved)

    def _release(self, lineage: str, tokens: int) -> None:
        with self._guard:
            left = self._inflight.get(lineage, 0) - tokens
            if left > 0:
                self._inflight[lineage] = left
            else:
                self._inflight.pop(lineage, None)

    def recover(self, lineage: str) -> int:
        """Settle every call of ``lineage`` reserved and never settled (its cell died in
        between) at its whole reservation, flagged ``recovered``; call before its lease
        returns. Returns how many were settled."""
        journal = self._cell.journal
        reserved: dict[str, ModelCallReserved] = {}
        for entry in journal.entries(types=("ModelCallReserved", "ModelCallSettled")):
            event = entry.event
            if isinstance(event, ModelCallReserved) and event.lineage == lineage:
                reserved[event.call] = event
            elif isinstance(event, ModelCallSettled):
                reserved.pop(event.call, None)
        settled = 0
        for call in reserved.values():
            with self._guard:
                self._inflight[lineage] = self._inflight.get(lineage, 0) + call.reserved
            whole = Settlement.of(
                call, call.prompt_estimate, call.max_tokens,
                estimated=True, how="recovered", status=0, latency_ms=0,
            )  # fmt: skip
            done = self.settle(whole)
            settled += done is not None
        return settled


# -- the server ------------------------------------------------------------------------


_Holder = tuple[str, str]


class _GoneError(Exception):
    """The worker's connection went away while its answer was being relayed."""


class ModelDoor:
    """The cell's model door: an HTTP server on a unix socket, one thread per
    connection, identity and allowance from the door (``member``, ``holder``)."""

    def __init__(
        self,
        path: Path,
        *,
        member: Callable[[int], Member | None],
        holder: Callable[[int], _Holder | None],
        meter: Callable[[], ModelMeter | None],
        endpoint: ModelEndpoint | None,
    ) -> None:
        self.path = path
        self.endpoint = endpoint
        self._holder = holder
        self._meter = meter
        self._conns: dict[socket.socket, tuple[_Holder, list[socket.socket]]] = {}
        self._lock = threading.Lock()
        self._pool = _Pool(endpoint)
        self._server = PeerServer(
            path, name="model", max_per_uid=MAX_CONNECTIONS, backlog=64,
            member=member, handler=self._serve, refusal=_refused,
        )  # fmt: skip

    def close(self) -> None:
        self._server.close()
        self.hang_up(lambda _: True)
        self._pool.close()

    def active(self, uid: int) -> int:
        return self._server.active(uid)

    def hang_up(self, which: Callable[[_Holder], bool]) -> None:
        """Shut down the connections (and their calls' upstream sockets) whose holder
        ``which`` picks: their threads settle what they relayed and end."""
        with self._lock:
            picked = [(c, ups) for c, (h, ups) in self._conns.items() if which(h)]
        for conn, upstreams in picked:
            for sock in [conn, *upstreams]:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def drain(self, uid: int) -> None:
        """Wait (at most 5 s) until no connection of ``uid`` holds a thread."""
        deadline = time.monotonic() + _DRAIN_S
        while self._server.active(uid) and time.monotonic() < deadline:
            time.sleep(0.001)

    # -- one connection ----------------------------------------------------------------

    def _serve(self, conn: socket.socket, uid: int) -> None:
        holder = self._holder(uid)
        if holder is None:
            with contextlib.suppress(OSError):
                conn.sendall(_simple(403, "not-a-worker", "this peer is no live worker"))
            return
        upstreams: list[socket.socket] = []
        with self._lock:
            self._conns[conn] = (holder, upstreams)
        conn.settimeout(_IDLE_TIMEOUT)
        http = h11.Connection(h11.SERVER)
        pending = _Pending()
        try:
            with contextlib.suppress(OSError, h11.ProtocolError, _GoneError):
                while self._one_request(conn, http, uid, holder, upstreams, pending):
                    http.start_next_cycle()
        finally:
            try:
                pending.flush()  # the connection's last call: settled before it ends
            finally:
                with self._lock:
                    self._conns.pop(conn, None)

    def _one_request(
        self,
        conn: socket.socket,
        http: h11.Connection,
        uid: int,
        holder: _Holder,
        upstreams: list[socket.socket],
        pending: _Pending,
    ) -> bool:
        """Serve one request; False when the connection is to close."""
        request, body = _read_request(conn, http, pending)
        if request is None:
            return False
        try:
            meter, chat, reserved = self._admit(request, body, uid, holder, pending)
        except _ReplyError as e:
            pending.flush()  # a refusal carries no settlement: the last call's goes first
            _send(conn, http, e.status, e.body)
            return e.keep and http.our_state is h11.DONE
        assert self.endpoint is not None  # _admit refused the call otherwise
        call = _Call(self.endpoint, meter, reserved, chat, conn, http, upstreams, self._pool)
        call.run(pending)  # its settlement is left with ``pending``
        return http.our_state is h11.DONE

    def _admit(
        self,
        request: h11.Request,
        body: bytes | None,
        uid: int,
        holder: _Holder,
        pending: _Pending,
    ) -> tuple[ModelMeter, ChatRequest, ModelCallReserved]:
        """The call parsed and reserved, or the reply that refuses it."""
        if self._holder(uid) != holder:
            raise _ReplyError(403, "not-a-worker", "the worker has ended", keep=False)
        path = request.target.decode("latin-1").split("?", 1)[0].rstrip("/")
        api = _PATHS.get(path)
        if request.method != b"POST" or api is None:
            raise _ReplyError(404, "not-found", "POST /v1/chat/completions or /v1/responses only")
        if body is None:
            raise _ReplyError(413, "too-large", f"a body is at most {MAX_BODY} B", keep=False)
        meter = self._meter()
        if meter is None:
            reason = ModelNotConfiguredError.reason
            raise _ReplyError(503, reason, "the model door is not attached to a cell")
        try:
            chat = ChatRequest.parse(body, api)
            if self.endpoint is None:
                meter.refuse_unconfigured(holder[1])  # journaled once, raises
            return meter, chat, meter.reserve(holder[1], chat, pending.take(meter))
        except ModelRequestError as e:
            raise _ReplyError(400, "invalid-request", str(e)) from e
        except ModelTokensError as e:
            raise _ReplyError(429, e.reason, str(e), kind="insufficient_quota") from e
        except ModelNotConfiguredError as e:
            raise _ReplyError(503, e.reason, str(e)) from e
        except CharterError as e:  # the journal allowance, a journal that failed
            raise _ReplyError(429, getattr(e, "reason", "refused"), str(e)) from e


class _ReplyError(Exception):
    """A call refused before it is sent: the reply, and whether the connection goes on."""

    def __init__(
        self, status: int, code: str, message: str, *, kind: str = "charter_refused",
        keep: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.body, self.keep = status, _error_body(code, message, kind=kind), keep


class _Pending:
    """A connection's answered call whose settlement is not yet journaled: carried by
    the connection's next reservation (one commit for both), else appended on its own
    after :data:`SETTLE_DELAY_S` without one, before a refusal is answered, and as the
    connection ends (a worker's end waits for that: ``ModelDoor.drain``). A cell that
    dies in between left the call reserved and unsettled, which the next incarnation
    settles (``recovered``)."""

    def __init__(self) -> None:
        self._held: tuple[ModelMeter, Settlement] | None = None

    def __bool__(self) -> bool:
        return self._held is not None

    def hold(self, meter: ModelMeter, settlement: Settlement) -> None:
        self.flush()  # at most one: a call's is settled before the next is held
        self._held = (meter, settlement)

    def take(self, meter: ModelMeter) -> Settlement | None:
        """The settlement for a reservation by ``meter`` to carry (it settles it)."""
        held, self._held = self._held, None
        if held is None:
            return None
        if held[0] is not meter:  # another cell's meter (a re-attached door): alone
            held[0].settle(held[1])
            return None
        return held[1]

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held[0].settle(held[1])


class _Pool:
    """Kept-alive connections to the model endpoint (at most :data:`_KEPT`), so a call
    does not pay a connection (and, to a hosted API, a TLS handshake) each time."""

    def __init__(self, endpoint: ModelEndpoint | None) -> None:
        self._url = urlsplit(endpoint.url) if endpoint is not None else None
        self._idle: list[UpstreamConnection] = []
        self._lock = threading.Lock()
        # Each API's request head at the endpoint (its path, and the header fields
        # every call sends, the held key's among them): derived once, not per call.
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if endpoint is not None and endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        self.heads: dict[Api, bytes] = {}
        if self._url is not None:
            base = self._url.path.rstrip("/")
            for api, tail in _UPSTREAM.items():
                self.heads[api] = request_head(self._url, base + tail, headers)

    def tries(self) -> tuple[bool, ...]:
        """A kept connection first (when one is idle), then a fresh one."""
        with self._lock:
            return (True, False) if self._idle else (False,)

    def take(self) -> UpstreamConnection | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def fresh(self) -> UpstreamConnection:
        url = self._url
        assert url is not None
        return UpstreamConnection(url, _IDLE_TIMEOUT)

    def give(self, conn: UpstreamConnection) -> None:
        with self._lock:
            if len(self._idle) < _KEPT:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Call:
    """One metered call: sent upstream, relayed, settled exactly once."""

    def __init__(
        self,
        endpoint: ModelEndpoint,
        meter: ModelMeter,
        reserved: ModelCallReserved,
        chat: ChatRequest,
        conn: socket.socket,
        http: h11.Connection,
        upstreams: list[socket.socket],
        pool: _Pool,
    ) -> None:
        self.endpoint, self.meter, self.reserved, self.chat = endpoint, meter, reserved, chat
        self.pool = pool
        self.conn, self.http, self.upstreams = conn, http, upstreams
        self.started = time.monotonic()
        self.first: float | None = None
        self.counted = 0  # completion tokens counted (one per content chunk)
        self.status = 0
        self.whole = False  # the server's answer was read to its end
        self.pending = _Pending()  # the connection's, from run()

    def _ms(self, at: float | None = None) -> int:
        return int(((at if at is not None else time.monotonic()) - self.started) * 1000)

    def _settle(self, prompt: int, completion: int, *, estimated: bool, how: SettleHow) -> None:
        """Decide the call's settlement now (its latency ends here); it is journaled by
        the connection (:class:`_Pending`), at the latest as the connection ends."""
        settlement = Settlement.of(
            self.reserved, prompt, completion, estimated=estimated, how=how,
            status=self.status, latency_ms=self._ms(),
            first_token_ms=None if self.first is None else self._ms(self.first),
        )  # fmt: skip
        self.pending.hold(self.meter, settlement)

    def _estimate(self, how: SettleHow) -> None:
        """No usage came: the prompt's estimate and the completion tokens counted (the
        whole ``max_tokens`` when nothing could be counted, the answer unread)."""
        completion = self.counted if how != "upstream-failed" else 0
        self._settle(self.reserved.prompt_estimate, completion, estimated=True, how=how)

    def run(self, pending: _Pending) -> None:
        """Send, relay, and leave the call's settlement with ``pending``."""
        self.pending = pending
        body = self.chat.upstream_body(self.reserved.max_tokens)
        head = self.pool.heads[self.chat.api]
        upstream, answer = None, None
        for reused in self.pool.tries():
            upstream = self.pool.take() if reused else self.pool.fresh()
            if upstream is None:
                continue
            try:
                if upstream.sock is None:
                    upstream.connect()
                if upstream.sock is not None:
                    self.upstreams.append(upstream.sock)
                answer = upstream.request(head, body)
                break
            except (OSError, ValueError) as e:
                self._forget(upstream)
                upstream.close()
                if not reused:  # a kept connection the server had closed: once more
                    self._estimate("upstream-failed")
                    _send(self.conn, self.http, 502, _error_body("upstream-failed", str(e)[:200]))
                    return
        assert upstream is not None
        assert answer is not None
        try:
            self.status = answer.status
            if self.chat.stream and answer.status == 200:
                self._relay_stream(answer)
            else:
                self._relay_whole(answer)
        finally:
            self._forget(upstream)
            if upstream.reusable and self.whole:
                self.pool.give(upstream)  # read to its end: kept for the next call
            else:
                upstream.close()

    def _forget(self, upstream: UpstreamConnection) -> None:
        with contextlib.suppress(ValueError):
            if upstream.sock is not None:
                self.upstreams.remove(upstream.sock)

    def _relay_whole(self, response: Answer) -> None:
        try:
            data = response.read(MAX_RESPONSE)
            self.whole = response.done
        except (OSError, ValueError):
            self._estimate("upstream-failed")
            _send(self.conn, self.http, 502, _error_body("upstream-failed", "the answer broke"))
            return
        usage = _usage(_chunk(data))
        kind = response.header("Content-Type", "application/json")
        try:
            _send(self.conn, self.http, response.status, data, kind)
        finally:  # settled after the answer is relayed, whether or not it arrived
            if usage is not None:
                self._settle(*usage, estimated=False, how="usage")
            elif response.status == 200:  # an answer without usage: the whole reservation
                self.counted = self.reserved.max_tokens
                self._estimate("no-usage")
            else:  # refused by the server, which reported no usage: nothing generated
                self._estimate("upstream-failed")

    def _relay_stream(self, response: Answer) -> None:
        http_, conn = self.http, self.conn
        try:
            head = h11.Response(
                status_code=200,
                headers=[("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")],
            )
            conn.sendall(http_.send(head) or b"")
            usage, how = self._relay_events(response)
            conn.sendall(http_.send(h11.EndOfMessage()) or b"")
        except (OSError, h11.LocalProtocolError) as e:
            # The worker went away mid-stream (or its sandbox was hung up); a read of
            # the server that broke (the hang-up shuts it too) ends here as well.
            self._settle_stream(None, "client-gone")
            raise _GoneError from e
        except ValueError:  # UpstreamProtocolError, a malformed chunk
            # The server's stream broke (or the door hung it up, the worker's sandbox
            # going): charged as counted.
            usage, how = None, "no-usage"
            try:
                conn.sendall(http_.send(h11.EndOfMessage()) or b"")
            except (OSError, h11.LocalProtocolError) as e:
                self._settle_stream(None, "client-gone")
                raise _GoneError from e
        self._settle_stream(usage, how)

    def _relay_events(self, response: Answer) -> tuple[tuple[int, int] | None, SettleHow]:
        """Relay the stream's events, each read's in one write (what one read gave,
        every whole event in it), up to the cut at the reservation; its usage, and how
        it ended."""
        usage: tuple[int, int] | None = None
        for events in event_batches(response.pieces()):
            usage, cut = self._forward(events, usage)
            if cut:
                return usage, "cut-at-cap"
        self.whole = True
        return usage, "usage" if usage is not None else "no-usage"

    def _forward(
        self, events: list[bytes], usage: tuple[int, int] | None
    ) -> tuple[tuple[int, int] | None, bool]:
        """Relay ``events`` in one write (the cut's event in place of the first past the
        reservation, and none after it); the usage seen so far, and whether it was cut."""
        out: list[bytes] = []
        cut = False
        for event in events:
            found, forward, cut = self._metered(event)
            usage = found if found is not None else usage
            if cut:
                out.append(_cut_event(self.chat.api))
                break
            if forward:
                out.append(event)
        if out:
            self.conn.sendall(self.http.send(h11.Data(data=b"".join(out))) or b"")
        return usage, cut

    def _metered(self, event: bytes) -> tuple[tuple[int, int] | None, bool, bool]:
        """One event of the stream: its usage (if it carries one), whether it is
        relayed, and whether it is past the reservation (the stream is cut before it)."""
        chunk = _chunk(data_of(event))
        found = _usage(chunk)
        forward = True
        if found is not None:  # the usage chunk: relayed only when asked for
            forward = self.chat.include_usage or bool(chunk.get("choices"))
        if _has_content(chunk):
            self.first = self.first or time.monotonic()
            self.counted += 1
            if self.counted > self.reserved.max_tokens:  # past the reservation
                self.counted = self.reserved.max_tokens  # what was relayed
                return found, False, True
        return found, forward, False

    def _settle_stream(self, usage: tuple[int, int] | None, how: SettleHow) -> None:
        if usage is not None and how == "usage":
            self._settle(*usage, estimated=False, how="usage")
        else:
            self._estimate(how)


# -- HTTP helpers ------------------------------------------------------------------------


def _read_request(
    conn: socket.socket, http: h11.Connection, pending: _Pending
) -> tuple[h11.Request | None, bytes | None]:
    """The next request and its body (None when over :data:`MAX_BODY`). A settlement
    pending waits for it at most :data:`SETTLE_DELAY_S`, then is journaled alone."""
    request: h11.Request | None = None
    chunks: list[bytes] = []
    size = 0
    while True:
        event = http.next_event()
        if event is h11.NEED_DATA:
            if pending:
                conn.settimeout(SETTLE_DELAY_S)
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    pending.flush()
                    continue
                finally:
                    conn.settimeout(_IDLE_TIMEOUT)
            else:
                data = conn.recv(65536)
            http.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_BODY:
                return request, None
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return request, b"".join(chunks)
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None, None


def _send(
    conn: socket.socket,
    http: h11.Connection,
    status: int,
    body: bytes,
    kind: str = "application/json",
) -> None:
    headers = [("Content-Type", kind), ("Content-Length", str(len(body)))]
    out = http.send(h11.Response(status_code=status, headers=headers)) or b""
    out += http.send(h11.Data(data=body)) or b""
    out += http.send(h11.EndOfMessage()) or b""
    conn.sendall(out)


def _cut_event(api: Api) -> bytes:
    """The event that ends a stream cut at the lease's cap, in the API's own shape."""
    message = "cut at the lease's cap"
    if api == "responses":  # the Responses stream's error event
        data = json.dumps(
            {"type": "error", "code": "model-tokens", "message": message, "param": None,
             "sequence_number": 0}
        ).encode()  # fmt: skip
        return b"event: error\ndata: " + data + b"\n\n"
    return b"data: " + _error_body("model-tokens", message) + b"\n\n"


def _error_body(code: str, message: str, *, kind: str = "charter_refused") -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def _simple(status: int, code: str, message: str) -> bytes:
    body = _error_body(code, message)
    return (
        f"HTTP/1.1 {status} Refused\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def _refused(uid: int, why: Refusal) -> bytes:
    del uid
    status = 403 if why in ("unknown", "outside") else 429
    return _simple(status, f"door-{why}", f"refused by the door ({why})")


def _chunk(data: bytes) -> dict[str, Any]:
    """An answer or chunk as a JSON object ({} when it is none)."""
    if not data:
        return {}
    try:
        loaded = json.loads(data)
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _usage(chunk: dict[str, Any]) -> tuple[int, int] | None:
    """``usage.prompt_tokens`` and ``usage.completion_tokens`` of an answer or chunk; of
    a Responses answer (or its stream's ``response.completed`` event, under
    ``response``), ``usage.input_tokens`` and ``usage.output_tokens``."""
    usage = chunk.get("usage")
    inner = chunk.get("response")
    if usage is None and isinstance(inner, dict):
        usage = inner.get("usage")
    if not isinstance(usage, dict):
        return None
    if "input_tokens" in usage and "prompt_tokens" not in usage:
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    else:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not (isinstance(prompt, int) and isinstance(completion, int)):
        return None
    if prompt < 0 or completion < 0 or isinstance(prompt, bool) or isinstance(completion, bool):
        return None
    return prompt, completion


def _has_content(chunk: dict[str, Any]) -> bool:
    """Whether a chunk carries generated text or a tool call (counted as one token): a
    choice's delta, or a Responses stream's ``*.delta`` event (text, refusal, reasoning,
    a function call's arguments)."""
    kind = chunk.get("type")
    if isinstance(kind, str) and kind.endswith(".delta"):
        return bool(chunk.get("delta"))
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content")
        ):
            return True
    return False
