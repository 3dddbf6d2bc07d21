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
   left), is drawn, under the lease's lock, from the lease's block of tokens held in the
   journal (``ModelTokensHeld``), in memory: no append on its path; when the block
   cannot cover it, a new block (:data:`BLOCK_CALLS` reservations, cut to the lease's
   tokens left net of its blocks) is journaled first, **before** anything is sent; a
   lease that cannot cover it is refused (429, ``model-tokens``, journaled once per
   lease as ``ModelCallRefused``);
2. the call is sent with ``max_tokens`` set to the reservation's (and, a streamed chat
   completion, ``stream_options.include_usage``); a stream whose counted tokens (one per
   content chunk or delta event) pass it is cut;
3. it is settled once, from the server's reported usage, or as an estimate flagged so
   (cut at the cap, client gone, no usage, server failed): decided when the answer
   ends, and journaled off the call's path by the meter's settler
   (``ModelCallSettled``, the call's one record, on its block's stream, after the
   ``UsageRecorded`` charging it; a lease's settlements gathered for
   :data:`SETTLE_GATHER_S` share one append), at the latest before a hold that needs
   its tokens and at the worker's end. A block is released (``ModelTokensReleased``)
   once no call will draw from it; a cell that died with one held leaves it to the
   next incarnation, which charges what its settled calls had not (``recover``).

A worker's end waits for its calls to settle: the door's ``unregister`` (before the cell
returns the lease) hangs up the model connections of the sandbox and waits for their
threads, then journals their settlements and releases the lease's blocks
(:meth:`ModelMeter.finish`).
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import h11

from charter.control import Pinned, append_pinned
from charter.core import BadInputError, Budget, CharterError, Event, now_ms
from charter.ledger import stream_uuid
from charter.runner._journal_allowance import model_block_bytes, model_draw_bytes
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
    ModelTokensHeld,
    ModelTokensReleased,
    model_block_stream,
)
from charter.sandbox import Member, PeerServer, Refusal

__all__ = [
    "BLOCK_CALLS",
    "BYTES_PER_TOKEN",
    "DEFAULT_MAX_TOKENS",
    "Draw",
    "JOURNAL_BLOCK",
    "MAX_BODY",
    "MAX_CONNECTIONS",
    "ModelDoor",
    "ModelEndpoint",
    "ModelMeter",
    "SETTLE_GATHER_S",
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
BLOCK_CALLS = 8
"""A block of tokens the model door holds for a lease: this many of the call's
reservation (cut to what the lease has left net of its blocks), so the next calls of
the lease draw from it with no append on their path."""
SETTLE_GATHER_S = 0.01
"""How long the settler waits, once a settlement is queued, for more to journal in the
same append (one commit, one ``UsageRecorded`` a lease, for the calls answered
meanwhile): less of its work beside the calls being made."""
_SETTLER_IDLE_S = 1.0  # the settler thread ends after this long with nothing queued
_RECOVER_TRIES = 5  # a recovery read again when the old incarnation settled meanwhile
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


@dataclass(eq=False)
class _Block:
    """A block of a lease's tokens, held in the journal (``ModelTokensHeld``) and drawn
    from here; this meter is the one writer of its stream while it holds it."""

    block: str
    lineage: str
    tokens: int
    version: int = 0  # its stream's version: its calls' settlements (its hold is the lease's)
    drawn: int = 0  # what its calls not yet settled drew
    charged: int = 0  # what its settled calls charged
    calls: int = 0  # its calls not yet settled
    retired: bool = False  # no call draws from it again (a newer block replaced it)
    kept: bool = False  # a settlement failed: held until the cell's end, never released
    released: bool = False
    settled: set[str] = field(default_factory=set)  # its calls tried, once each

    @property
    def free(self) -> int:
        return self.tokens - self.drawn - self.charged

    @property
    def holding(self) -> int:
        """What it holds against its lease (its settled calls' charges are the lease's)."""
        return 0 if self.released else max(self.tokens - self.charged, 0)

    @property
    def idle(self) -> bool:
        """No call of it in flight and none failed: the next hold may release it."""
        return not self.calls and not self.kept

    def stream(self) -> str:
        return model_block_stream(self.block)


def _released(lineage: str, blocks: Iterable[_Block]) -> list[ModelTokensReleased]:
    """The releases of ``blocks`` of ``lineage`` whose calls all settled (nothing charged
    with them: their charges are on record)."""
    return [
        ModelTokensReleased(block=b.block, lineage=lineage, charged=0, recovered=False)
        for b in blocks
    ]


@dataclass(frozen=True)
class Draw:
    """One call's share of a block: what it reserved, never journaled on its own (its
    settlement carries it)."""

    call: str
    lineage: str
    block: _Block = field(repr=False)
    model: str
    digest: str
    stream_response: bool
    prompt_estimate: int
    max_tokens: int
    reserved: int


@dataclass
class Settlement:
    """A call's settlement, decided when its answer ended: journaled once (``done``
    once it was tried; ``committed`` once it is on record)."""

    draw: Draw
    event: ModelCallSettled
    done: bool = False
    committed: bool = False

    @classmethod
    def of(
        cls,
        draw: Draw,
        prompt: int,
        completion: int,
        *,
        estimated: bool,
        how: SettleHow,
        status: int,
        latency_ms: int,
        first_token_ms: int | None = None,
    ) -> Settlement:
        event = ModelCallSettled(
            call=draw.call, lineage=draw.lineage, block=draw.block.block, model=draw.model,
            digest=draw.digest, stream_response=draw.stream_response,
            prompt_estimate=draw.prompt_estimate, max_tokens=draw.max_tokens,
            reserved=draw.reserved, prompt_tokens=prompt, completion_tokens=completion,
            estimated=estimated, how=how, status=status, latency_ms=latency_ms,
            first_token_ms=first_token_ms,
        )  # fmt: skip
        return cls(draw, event)


def _tokens(n: int) -> Budget:
    return Budget(tokens=n, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)


class ModelMeter:
    """Reservations of one cell's model calls against their leases' tokens, drawn from
    blocks held in the journal, and their settlement (docs/model-door.md)."""

    def __init__(self, cell: Any) -> None:
        self._cell = cell
        self._blocks: dict[str, list[_Block]] = {}  # lineage -> its blocks not released
        self._queued: list[Settlement] = []  # answered, for the settler to journal
        self._refused: set[tuple[str, str]] = set()  # (lineage, reason) journaled once
        self._prepaid: dict[str, int] = {}  # journal bytes charged, not yet used
        self._guard = threading.Lock()
        self._wake = threading.Condition(self._guard)
        self._settler: threading.Thread | None = None
        # One writer of the blocks' streams at a time: a settlement, a hold, a release.
        self._settling = threading.Lock()

    def in_flight(self, lineage: str) -> int:
        """Tokens ``lineage``'s blocks hold (net of their settled calls' charges)."""
        with self._guard:
            return sum(b.holding for b in self._blocks.get(lineage, ()))

    def reserve(self, lineage: str, request: ChatRequest) -> Draw:
        """Draw the call's tokens from ``lineage``'s block, in memory; when it cannot
        cover them, hold a new block of the lease's tokens (net of its blocks), journaled
        before the call is sent, or refuse (journaled once per lease)."""
        estimate = prompt_estimate(request.body)
        with self._cell.journal_allowance.held(lineage):  # one reservation at a time
            draw = self._draw(lineage, request, estimate)
            if draw is None:
                with self._settling:
                    draw = self._hold(lineage, request, estimate)
            else:
                try:
                    self._charge_journal(lineage, model_draw_bytes(lineage, request.model))
                except BaseException:
                    self._undraw(draw)
                    raise
        return draw

    def _draw(self, lineage: str, request: ChatRequest, estimate: int) -> Draw | None:
        with self._guard:
            blocks = self._blocks.get(lineage)
            block = blocks[-1] if blocks else None
            if block is None or block.retired:
                return None
            max_tokens = request.max_tokens
            if max_tokens is None:
                if block.free - estimate < DEFAULT_MAX_TOKENS:  # the lease's left decides
                    return None
                max_tokens = DEFAULT_MAX_TOKENS
            need = estimate + max_tokens
            if need > block.free:
                return None
            block.drawn += need
            block.calls += 1
        return self._made(block, request, estimate, max_tokens, need)

    def _made(
        self, block: _Block, request: ChatRequest, estimate: int, max_tokens: int, need: int
    ) -> Draw:
        return Draw(
            call=uuid.uuid4().hex, lineage=block.lineage, block=block, model=request.model,
            digest=hashlib.sha256(request.body).hexdigest(), stream_response=request.stream,
            prompt_estimate=estimate, max_tokens=max_tokens, reserved=need,
        )  # fmt: skip

    def _undraw(self, draw: Draw) -> None:
        with self._guard:
            draw.block.drawn -= draw.reserved
            draw.block.calls -= 1

    def _hold(self, lineage: str, request: ChatRequest, estimate: int) -> Draw:
        """Hold a new block for the call (hold ``_settling``), releasing in the same
        append the lease's blocks none of whose calls is in flight; or refuse.

        Decided first to settle what is queued and charge its journal bytes (each an
        append of its own), then decided again in the control layer's loop
        (:func:`append_pinned`) on views refreshed after the lease's stream's version,
        and appended on that stream pinned to it: a spawn (or any usage) of the lease
        that commits in between makes the hold decided again (smaller, or refused),
        and one decided before the hold conflicts at its own pin."""
        cell = self._cell
        remaining, left = self._remaining(lineage)
        max_tokens, need = self._need(request, estimate, left)
        if need > left and self._settle_queued(lineage):
            remaining, left = self._remaining(lineage)  # their charges, not their holds
            max_tokens, need = self._need(request, estimate, left)
        if need > left:
            self._refuse_hold(lineage, estimate, max_tokens, need, left)
        sized = ModelTokensHeld(
            block=uuid.uuid4().hex, lineage=lineage, cell=cell.cell,
            tokens=min(left, need * BLOCK_CALLS),
        )  # fmt: skip
        nbytes = model_block_bytes(sized) + model_draw_bytes(lineage, request.model)
        self._charge_journal(lineage, nbytes, remaining.egress_bytes)
        made: list[tuple[ModelTokensHeld, list[_Block], int, int]] = []

        def decide(versions: dict[str, int]) -> Pinned:
            # The views were refreshed after the lease's stream's version was read.
            left = self._left(lineage, cell.resources.book.remaining(lineage, now_ms()).tokens)
            max_tokens, need = self._need(request, estimate, left)
            if need > left:  # a spawn or a charge of the lease committed since
                self._refuse_hold(lineage, estimate, max_tokens, need, left)
            held = sized.model_copy(update={"tokens": min(left, need * BLOCK_CALLS)})
            with self._guard:
                idle = [b for b in self._blocks.get(lineage, ()) if b.idle]
            made.append((held, idle, max_tokens, need))
            released = _released(lineage, idle)
            pins = {lineage: versions[lineage]} | {b.stream(): b.version for b in idle}
            return Pinned([*released, held], pins)

        append_pinned(
            cell.journal, cell.app.views, [lineage], decide, what=f"a model hold of {lineage}"
        )
        held, idle, max_tokens, need = made[-1]
        block = _Block(held.block, lineage, held.tokens, drawn=need, calls=1)
        with self._guard:
            kept = [b for b in self._blocks.get(lineage, ()) if b not in idle]
            for b in idle:
                b.released = True
            for b in kept:
                b.retired = True
            self._blocks[lineage] = [*kept, block]
        return self._made(block, request, estimate, max_tokens, need)

    def _remaining(self, lineage: str) -> tuple[Budget, int]:
        """The lease's remainder as the journal stands, and its tokens :meth:`_left`."""
        with self._cell.changed:
            self._cell.refresh()
            remaining: Budget = self._cell.resources.book.remaining(lineage, now_ms())
        return remaining, self._left(lineage, remaining.tokens)

    def _refuse_hold(
        self, lineage: str, estimate: int, max_tokens: int, need: int, left: int
    ) -> None:
        self._refuse(
            lineage,
            ModelTokensError(
                f"{lineage}'s lease has {max(left, 0)} tokens left (net of its calls "
                f"in flight); this call reserves {need} (a prompt of about "
                f"{estimate} and max_tokens {max_tokens}): ask for fewer "
                "max_tokens, or spawn with more tokens"
            ),
            need,
            left,
        )

    def _left(self, lineage: str, tokens: int) -> int:
        """The lease's ``tokens`` (its remainder in the lease book, net of every block
        it holds) and what its idle blocks hold, which the next hold releases in its
        append (the book's figures: the cell's view has just been read)."""
        with self._guard:
            idle = [b.block for b in self._blocks.get(lineage, ()) if b.idle]
        if not idle:
            return tokens
        with self._cell.changed:
            held: int = self._cell.resources.book.held(lineage, idle)
        return tokens + held

    @staticmethod
    def _need(request: ChatRequest, estimate: int, left: int) -> tuple[int, int]:
        """The call's ``max_tokens`` (the worker's, else the default cut to ``left``) and
        its reservation, the estimate plus at least one token."""
        max_tokens = request.max_tokens
        if max_tokens is None:
            max_tokens = min(DEFAULT_MAX_TOKENS, left - estimate)
        return max(max_tokens, 1), estimate + max(max_tokens, 1)

    def _charge_journal(self, lineage: str, nbytes: int, egress_left: int | None = None) -> None:
        """Charge a call's journal bytes to the lease's journal allowance (hold its
        lock): from what was prepaid, else prepaying :data:`JOURNAL_BLOCK` bytes at
        once when the lease's egress covers it (past the floor that is one egress
        charge for about twenty calls, not one each; at most a block is charged and
        never journaled), else exactly ``nbytes`` (refused, and journaled, when the
        allowance cannot pay even that). ``egress_left``: the lease's, read when None."""
        with self._guard:
            prepaid = self._prepaid.get(lineage, 0)
        if prepaid < nbytes:
            cell = self._cell
            if egress_left is None:
                with cell.changed:
                    cell.refresh()
                    egress_left = cell.resources.book.remaining(lineage, now_ms()).egress_bytes
            allowance = cell.journal_allowance
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

    # -- settlement ----------------------------------------------------------------

    def queue(self, settlement: Settlement) -> None:
        """Leave an answered call's settlement to the settler (off the call's path): it
        is journaled in order, at the latest before its lease's next hold that needs
        its tokens, or its worker's end (:meth:`finish`)."""
        with self._guard:
            self._queued.append(settlement)
            if self._settler is None:
                self._settler = threading.Thread(
                    target=self._settle_loop, name="model-settler", daemon=True
                )
                self._settler.start()
            self._wake.notify()

    def _settle_loop(self) -> None:
        while True:
            with self._guard:
                if not self._queued:
                    self._wake.wait(_SETTLER_IDLE_S)
                if not self._queued:  # idle: ends (the next queued call starts another)
                    self._settler = None
                    return
            time.sleep(SETTLE_GATHER_S)  # the calls answered meanwhile: in the same append
            with self._settling:
                with self._guard:
                    batch, self._queued = self._queued, []
                for lineage in dict.fromkeys(s.draw.lineage for s in batch):
                    with contextlib.suppress(Exception):  # logged by _commit
                        self._commit(*(s for s in batch if s.draw.lineage == lineage))

    def _settle_queued(self, lineage: str) -> bool:
        """Journal ``lineage``'s queued settlements now (hold ``_settling``); whether
        there were any."""
        with self._guard:
            mine = [s for s in self._queued if s.draw.lineage == lineage]
            self._queued = [s for s in self._queued if s.draw.lineage != lineage]
        self._commit(*mine)
        return bool(mine)

    def settle(self, settlement: Settlement) -> ModelCallSettled | None:
        """Journal the call's settlement now (None when it was settled already, or its
        block was recovered by a later incarnation: never twice)."""
        if settlement.done:
            return None
        with self._settling:
            self._commit(settlement)
        return settlement.event if settlement.committed else None

    def finish(self, lineage: str) -> None:
        """The worker's end (its model connections closed): journal its queued
        settlements, then release its blocks, in one append; a block still held (a
        call in flight past the drain, a settlement that failed) is recovered."""
        with self._settling:
            self._settle_queued(lineage)
            with self._guard:
                blocks = list(self._blocks.get(lineage, ()))
                idle = [b for b in blocks if b.idle]
                for b in blocks:
                    b.retired = True  # none drawn from again
            self._release_idle(lineage, idle)
            with self._guard:
                left = bool(self._blocks.get(lineage))
            if left:  # a call in flight past the drain, a settlement or release failed
                self._recover_left(lineage)

    def _release_idle(self, lineage: str, idle: list[_Block]) -> None:
        """Release ``idle`` (none of their calls in flight), in one append."""
        if idle:
            released = _released(lineage, idle)
            try:
                with self._cell.changed:
                    pins = {b.stream(): b.version for b in idle}
                    self._cell.applied(self._cell.journal.append(released, expect=pins))
            except CharterError:  # still held on record: recovered below
                _log.warning("%s: its model blocks could not be released", lineage)
                return
            with self._guard:
                for b in idle:
                    b.released = True
                self._blocks[lineage] = [b for b in self._blocks.get(lineage, ()) if b not in idle]

    def _recover_left(self, lineage: str) -> None:
        """The worker's end found blocks still held: a call in flight past the door's
        drain, or a settlement that could not be journaled. Charged now as a recovery
        does (each block less its settled calls' charges, fail-closed) before the lease
        returns, else their calls' tokens would be charged to no lease; a settlement
        after this finds its block released (its tokens are in the release's charge)."""
        for _ in range(_RECOVER_TRIES):
            with contextlib.suppress(ModelCallSettledError):
                self._recover_blocks(lineage)
                break
        with self._guard:
            left = self._blocks.pop(lineage, [])
            for b in left:
                b.released = True

    def _commit(self, *pendings: Settlement) -> None:
        """Charge the calls' tokens (of one lease) and journal their settlements in one
        append (hold ``_settling``): one ``UsageRecorded`` charging their sum, then each
        ``ModelCallSettled`` on its block's stream, pinned at the version this meter
        wrote; each once (``done`` after this, whatever happened). A retired block's
        last call releases it in the same append."""
        journal = self._cell.journal
        mine: list[Settlement] = []
        with self._guard:
            for pending in pendings:
                block = pending.draw.block
                if pending.done or pending.draw.call in block.settled or block.released:
                    pending.done = True  # tried once already: never charged twice
                    continue
                pending.done = True
                block.settled.add(pending.draw.call)
                mine.append(pending)
            if not mine:
                return
            blocks = list(dict.fromkeys(p.draw.block for p in mine))
            settling = {b: sum(p.draw.block is b for p in mine) for b in blocks}
            last = {b for b in blocks if b.retired and b.calls == settling[b] and not b.kept}
        lineage = mine[0].draw.lineage
        events: list[Event] = [p.event for p in mine]
        events += _released(lineage, (b for b in blocks if b in last))
        pins = {b.stream(): b.version for b in blocks}
        tries = 0

        def also() -> tuple[list[Event], dict[str, int]]:
            # Pinned to the blocks' streams being as this meter left them: another
            # writer (a later incarnation's recovery) released one, and charged its
            # calls then.
            nonlocal tries
            tries += 1
            if tries > 1 and any(journal.stream_version(s) != v for s, v in pins.items()):
                raise ModelCallSettledError("a model call's block was recovered")
            return events, pins

        tokens = sum(p.event.prompt_tokens + p.event.completion_tokens for p in mine)
        outcome: Literal["committed", "taken", "failed"] = "failed"
        try:
            holds = [b.block for b in blocks]
            self._cell.budgets.record_usage(lineage, _tokens(tokens), then=also, holds=holds)
            outcome = "committed"
        except ModelCallSettledError:
            outcome = "taken"
        except CharterError:
            # The lease ended first (its refusal is journaled): the calls are still
            # settled, so their tokens are on record, charged or not.
            with contextlib.suppress(CharterError), self._cell.changed:
                if all(journal.stream_version(s) == v for s, v in pins.items()):
                    self._cell.applied(journal.append(events, expect=pins))
                    outcome = "committed"
            if outcome != "committed":
                _log.warning("%s: %d model calls' settlements not journaled", lineage, len(mine))
        finally:
            written = {b: settling[b] + (b in last) for b in blocks}
            for pending in mine:
                self._after(pending, outcome, written, last=pending.draw.block in last)

    def _after(
        self, pending: Settlement, outcome: Literal["committed", "taken", "failed"],
        written: dict[_Block, int], *, last: bool,
    ) -> None:  # fmt: skip
        """A settlement tried: its draw given back, its charge counted, its block
        released when it was the last; taken by another writer, or failed, the block is
        drawn from no more (failed: held until the cell ends, then recovered)."""
        draw = pending.draw
        block = draw.block
        settled = pending.event
        with self._guard:
            block.drawn -= draw.reserved
            block.calls -= 1
            if outcome == "committed":
                pending.committed = True
                block.charged += settled.prompt_tokens + settled.completion_tokens
                block.version += written.pop(block, 0)  # once per block
            block.retired = block.retired or outcome != "committed"
            block.kept = block.kept or outcome == "failed"
            # Taken, a kept block (a settlement of it failed, perhaps committed unseen:
            # this meter's version of it is behind, so the conflict may be its own) is
            # still held, left for the worker's end to recover from the journal.
            taken = outcome == "taken" and not block.kept
            if (outcome == "committed" and last) or taken:
                block.released = True  # by this append, or by the other writer
                blocks = self._blocks.get(draw.lineage, [])
                self._blocks[draw.lineage] = [b for b in blocks if b is not block]

    # -- recovery ----------------------------------------------------------------------

    def recover(self, lineage: str) -> int:
        """Settle what ``lineage``'s last incarnation left held (its cell died in
        between), fail-closed, before its lease returns: each block not released is
        released charging what its settled calls had not (an estimate, flagged
        ``recovered``), and each call reserved on its own (``ModelCallReserved``, an
        older door) and never settled, its whole reservation. Returns how many."""
        for _ in range(_RECOVER_TRIES):  # a settlement of the old incarnation raced
            with contextlib.suppress(ModelCallSettledError):
                return self._recover_blocks(lineage) + self._recover_calls(lineage)
        return 0

    def _recover_blocks(self, lineage: str) -> int:
        journal = self._cell.journal
        held: dict[str, list[int]] = {}  # block -> [tokens, charged, version]
        types = ("ModelTokensHeld", "ModelCallSettled", "ModelTokensReleased")
        for entry in journal.entries(types=types):
            event = entry.event
            if isinstance(event, ModelTokensHeld) and event.lineage == lineage:
                # Its block's stream starts with its first settlement; a hold journaled
                # before holds moved to the lease's stream is its block's first entry.
                first = entry.stream == stream_uuid(model_block_stream(event.block))
                held[event.block] = [event.tokens, 0, entry.stream_version if first else 0]
            elif isinstance(event, ModelCallSettled) and event.block in held:
                row = held[event.block]
                row[1] += event.prompt_tokens + event.completion_tokens
                row[2] = entry.stream_version
            elif isinstance(event, ModelTokensReleased):
                held.pop(event.block, None)
        for block, (tokens, charged, version) in held.items():
            remainder = max(tokens - charged, 0)
            release = ModelTokensReleased(
                block=block, lineage=lineage, charged=remainder, recovered=True
            )
            stream = release.stream()
            if remainder == 0:
                try:
                    with self._cell.changed:
                        self._cell.applied(journal.append([release], expect={stream: version}))
                except CharterError as e:  # its stream moved (a late settlement): again
                    raise ModelCallSettledError(f"block {stream} moved: read again") from e
                continue
            tries = 0

            def also(
                stream: str = stream, version: int = version, release: Event = release
            ) -> tuple[list[Event], dict[str, int]]:
                nonlocal tries
                tries += 1
                if tries > 1 and journal.stream_version(stream) != version:
                    raise ModelCallSettledError(f"block {stream} moved: read again")
                return [release], {stream: version}

            try:
                self._cell.budgets.record_usage(
                    lineage, _tokens(remainder), then=also, holds=(block,)
                )
            except ModelCallSettledError:
                raise
            except CharterError:  # the lease ended: the release is on record alone
                with contextlib.suppress(CharterError), self._cell.changed:
                    if journal.stream_version(stream) == version:
                        self._cell.applied(journal.append([release], expect={stream: version}))
        return len(held)

    def _recover_calls(self, lineage: str) -> int:
        """Calls an older door reserved on their own and never settled: each at its whole
        reservation, pinned to its stream being at its reservation."""
        journal = self._cell.journal
        reserved: dict[str, ModelCallReserved] = {}
        for entry in journal.entries(types=("ModelCallReserved", "ModelCallSettled")):
            event = entry.event
            if isinstance(event, ModelCallReserved) and event.lineage == lineage:
                reserved[event.call] = event
            elif isinstance(event, ModelCallSettled):
                reserved.pop(event.call, None)
        for call in reserved.values():
            settled = ModelCallSettled(
                call=call.call, lineage=lineage, prompt_tokens=call.prompt_estimate,
                completion_tokens=call.max_tokens, estimated=True, how="recovered",
                status=0, latency_ms=0,
            )  # fmt: skip
            stream = call.stream()

            def also(
                stream: str = stream, settled: Event = settled
            ) -> tuple[list[Event], dict[str, int]]:
                if journal.stream_version(stream) != 1:
                    raise ModelCallSettledError(f"{stream} is settled already")
                return [settled], {stream: 1}

            with contextlib.suppress(ModelCallSettledError, CharterError):
                self._cell.budgets.record_usage(lineage, _tokens(call.reserved), then=also)
        return len(reserved)


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
        self._served: dict[str, str] = {}  # sandbox id -> its worker's lineage
        self._hung: set[socket.socket] = set()  # connections hung up, their threads ending
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
            # Before their upstream sockets are read: a call that connects one after
            # this sees it hung up and sends nothing (_Call.run).
            self._hung.update(c for c, _ in picked)
        for conn, upstreams in picked:
            for sock in [conn, *upstreams]:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def forget(self, sandbox_id: str) -> str | None:
        """The lineage whose calls a sandbox made here (None: it made none), forgotten."""
        with self._lock:
            return self._served.pop(sandbox_id, None)

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
            self._served[holder[0]] = holder[1]
        conn.settimeout(_IDLE_TIMEOUT)
        http = h11.Connection(h11.SERVER)
        try:
            with contextlib.suppress(OSError, h11.ProtocolError, _GoneError):
                while self._one_request(conn, http, uid, holder, upstreams):
                    http.start_next_cycle()
        finally:
            with self._lock:
                self._conns.pop(conn, None)
                self._hung.discard(conn)

    def _one_request(
        self,
        conn: socket.socket,
        http: h11.Connection,
        uid: int,
        holder: _Holder,
        upstreams: list[socket.socket],
    ) -> bool:
        """Serve one request; False when the connection is to close."""
        request, body = _read_request(conn, http)
        if request is None:
            return False
        try:
            meter, chat, draw = self._admit(request, body, uid, holder)
        except _ReplyError as e:
            _send(conn, http, e.status, e.body)
            return e.keep and http.our_state is h11.DONE
        assert self.endpoint is not None  # _admit refused the call otherwise
        call = _Call(
            self.endpoint, meter, draw, chat, conn, http, upstreams, self._pool,
            gone=lambda: conn in self._hung,
        )  # fmt: skip
        call.run()  # its settlement is left with the meter's settler
        return http.our_state is h11.DONE

    def _admit(
        self,
        request: h11.Request,
        body: bytes | None,
        uid: int,
        holder: _Holder,
    ) -> tuple[ModelMeter, ChatRequest, Draw]:
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
            return meter, chat, meter.reserve(holder[1], chat)
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
        reserved: Draw,
        chat: ChatRequest,
        conn: socket.socket,
        http: h11.Connection,
        upstreams: list[socket.socket],
        pool: _Pool,
        gone: Callable[[], bool] = lambda: False,
    ) -> None:
        self.endpoint, self.meter, self.reserved, self.chat = endpoint, meter, reserved, chat
        self.pool, self.gone = pool, gone
        self.conn, self.http, self.upstreams = conn, http, upstreams
        self.started = time.monotonic()
        self.first: float | None = None
        self.counted = 0  # completion tokens counted (one per content chunk)
        self.status = 0
        self.whole = False  # the server's answer was read to its end

    def _ms(self, at: float | None = None) -> int:
        return int(((at if at is not None else time.monotonic()) - self.started) * 1000)

    def _settle(self, prompt: int, completion: int, *, estimated: bool, how: SettleHow) -> None:
        """Decide the call's settlement now (its latency ends here); it is journaled by
        the meter's settler, off the call's path (:meth:`ModelMeter.queue`)."""
        settlement = Settlement.of(
            self.reserved, prompt, completion, estimated=estimated, how=how,
            status=self.status, latency_ms=self._ms(),
            first_token_ms=None if self.first is None else self._ms(self.first),
        )  # fmt: skip
        self.meter.queue(settlement)

    def _estimate(self, how: SettleHow) -> None:
        """No usage came: the prompt's estimate and the completion tokens counted (the
        whole ``max_tokens`` when nothing could be counted, the answer unread)."""
        completion = self.counted if how != "upstream-failed" else 0
        self._settle(self.reserved.prompt_estimate, completion, estimated=True, how=how)

    def run(self) -> None:
        """Send, relay, and leave the call's settlement with the meter."""
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
                if self.gone():  # hung up meanwhile (the worker's end): nothing is sent
                    self._forget(upstream)
                    upstream.close()
                    self._estimate("client-gone")
                    raise _GoneError
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
    conn: socket.socket, http: h11.Connection
) -> tuple[h11.Request | None, bytes | None]:
    """The next request and its body (None when over :data:`MAX_BODY`)."""
    request: h11.Request | None = None
    chunks: list[bytes] = []
    size = 0
    while True:
        event = http.next_event()
        if event is h11.NEED_DATA:
            http.receive_data(conn.recv(65536))
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
