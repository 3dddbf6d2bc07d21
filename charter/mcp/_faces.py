"""Who the MCP client is, and what each tool does for it.

A *face* is the identity one server serves, fixed when the server starts, never read
from a tool's arguments:

- :class:`OperatorFace`: outside a sandbox, the operator acting as a durable agent
  (``agent:NAME``) through the process's one composition root (:class:`Charter`): a
  spawn is ``Charter.spawn`` with the agent's :class:`Caller`, as ``charter spawn``
  does; reads are the projections (budgets, tree) and the workers' fold.
- :class:`DoorFace`: inside a worker's sandbox, the worker: every call goes to its
  door (``/run/charter/keys.sock``), which identifies the worker by the kernel, and the
  door spawns with the worker's ``Caller`` (``Charter.spawn``), exactly as for a
  worker's own door client.

Every answer is a JSON object with ``position``: the journal position it is based on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import ConfigDict, Field, ValidationError

from charter.app import Charter
from charter.authority import SpawnIntent
from charter.control import WorkerSpec
from charter.core import BadInputError, CheckedModel, Lineage, LineageError, describe_invalid
from charter.mcp.errors import IdentityInArgumentsError, NotThroughDoorError
from charter.projections import Projector
from charter.runner.client import Door, DoorError
from charter.runner.errors import RevokeRefusedError, WaitRefusedError
from charter.runner.requests import WorkerRequests
from charter.runner.status import WorkerWatch

__all__ = [
    "IDENTITY_FIELDS",
    "MAX_WAIT_S",
    "DoorFace",
    "Face",
    "NoParams",
    "OperatorFace",
    "RevokeParams",
    "WaitParams",
    "parse",
]

# A tool call must come back well within the ~60 s MCP clients allow one.
MAX_WAIT_S = 30.0
_POLL_S = 0.05

# Names that say who is asking: refused in any tool's arguments with their own reason.
IDENTITY_FIELDS = frozenset(
    {
        "agent", "as", "caller", "cell", "identity", "issuer", "lineage", "on_behalf_of",
        "operator", "parent", "root", "subject", "token", "user", "worker",
    }
)  # fmt: skip


class _Params(CheckedModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WaitParams(_Params):
    children: tuple[str, ...] = Field(
        min_length=1, max_length=10_000, description="Lineages of children this caller spawned."
    )
    timeout_s: float = Field(
        default=25.0,
        ge=0,
        le=MAX_WAIT_S,
        description=f"Return after at most this long (at most {MAX_WAIT_S:g} s), with what "
        "has ended so far; call again with the cursor to go on waiting.",
    )
    cursor: int | None = Field(
        default=None,
        ge=0,
        description="The cursor a previous wait returned: this call then returns as soon "
        "as any of the children ends after it (or all have ended, or the timeout).",
    )


class RevokeParams(_Params):
    lineage: str = Field(
        min_length=1, max_length=4096, description="One of this caller's own descendants."
    )
    reason: str = Field(default="", max_length=1024, description="Why (journaled).")


class NoParams(_Params):
    pass


M = TypeVar("M", bound=CheckedModel)


def parse(model: type[M], arguments: Mapping[str, Any] | None, *, keep: frozenset[str]) -> M:
    """``arguments`` as ``model``: unknown fields refused, an identity field among them
    with its own reason (``keep``: the model's fields that merely share a name, such
    as revoke's target ``lineage``)."""
    given = dict(arguments or {})
    named = sorted((set(given) & IDENTITY_FIELDS) - keep)
    if named:
        raise IdentityInArgumentsError(
            f"the arguments name who is asking ({', '.join(named)}): identity comes from the "
            "connection (the operator's token, or the worker's sandbox), never from the "
            "arguments"
        )
    try:
        return model.model_validate(given)
    except ValidationError as e:
        raise BadInputError(describe_invalid(e)) from e


class Face(Protocol):
    """What a client may do, as the one identity its connection carries."""

    kind: ClassVar[str]

    def whoami(self) -> dict[str, Any]: ...

    def spawn(self, intent: SpawnIntent) -> dict[str, Any]: ...

    def wait(self, params: WaitParams) -> dict[str, Any]: ...

    def budget(self) -> dict[str, Any]: ...

    def subtree(self) -> dict[str, Any]: ...

    def revoke(self, params: RevokeParams) -> dict[str, Any]: ...


def _descendant(caller: Lineage, target: str) -> Lineage:
    try:
        lineage = Lineage(target)
    except LineageError:
        lineage = None
    if lineage is None or not caller.is_ancestor_of(lineage):
        raise RevokeRefusedError(f"{target} is not a descendant of {caller}")
    return lineage


class OperatorFace:
    """The operator as the durable agent ``agent``, through ``charter`` (the process's
    one composition root). ``worker``: what each child runs on a cell (None: children
    are minted and leased only, as ``charter spawn`` without a command)."""

    kind: ClassVar[str] = "operator"

    def __init__(self, charter: Charter, agent: str, worker: WorkerSpec | None) -> None:
        self.charter = charter
        self.lineage = Lineage.root(agent)
        self.worker = worker
        charter.spawn_service().agent(agent)  # an unknown agent is refused at start
        self._lock = threading.Lock()  # one service call at a time on the one root
        self._watch = WorkerWatch(charter.journal)
        self._projector: Projector | None = None
        # child -> position of its WorkerEnded, read from _floor up to _scanned: from
        # the head at start, and back to the oldest child a wait asked about.
        self._ended_at: dict[str, int] = {}
        self._floor = self._scanned = self._head()

    def close(self) -> None:
        if self._projector is not None:
            self._projector.close()

    def _head(self) -> int:
        head = self.charter.journal.head()
        return head[0] if head else 0

    def whoami(self) -> dict[str, Any]:
        with self._lock:
            return {"lineage": str(self.lineage), "face": self.kind, "position": self._head()}

    def spawn(self, intent: SpawnIntent) -> dict[str, Any]:
        workers = (self.worker,) if self.worker is not None else None
        with self._lock:
            result = self.charter.spawn(self.lineage, intent, workers=workers)
        return result.to_json() | {
            "position": result.positions[1],
            "scheduled": workers is not None,
        }

    def wait(self, params: WaitParams) -> dict[str, Any]:
        children = tuple(dict.fromkeys(params.children))
        with self._lock:
            self._refresh()
            for child in children:
                try:
                    parent = Lineage(child).parent
                except LineageError:
                    parent = None
                if parent != self.lineage or child not in self._watch.view.workers:
                    raise WaitRefusedError(
                        f"{child} is not a child {self.lineage} spawned with a worker to run"
                    )
            oldest = min(self._watch.view.workers[c].position for c in children)
            if oldest < self._floor:  # children older than this server: read their ends
                self._read_ends(oldest, self._floor)
                self._floor = oldest
        deadline = time.monotonic() + params.timeout_s
        while True:
            with self._lock:
                self._refresh()
                answer = self._answer(children, params.cursor)
            if answer["complete"] or answer["new"] or time.monotonic() >= deadline:
                return answer
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def _refresh(self) -> None:
        """Fold what was committed since the last look: the workers, and the position
        each one's end was committed at (what a cursor is compared with)."""
        self._watch.view.refresh(self.charter.journal)
        upto = self._watch.view.position
        if upto > self._scanned:
            self._read_ends(self._scanned + 1, upto)
            self._scanned = upto

    def _read_ends(self, start: int, stop: int) -> None:
        for entry in self.charter.journal.entries(start, stop, ("WorkerEnded",)):
            self._ended_at[getattr(entry.event, "lineage", "")] = entry.position

    def _answer(self, children: tuple[str, ...], cursor: int | None) -> dict[str, Any]:
        workers = self._watch.view.workers
        done: dict[str, Any] = {}
        pending: dict[str, Any] = {}
        for child in children:
            record = workers.get(child)
            if record is not None and record.ended is not None and child in self._ended_at:
                answer = WorkerRequests._answer(record)
                assert isinstance(answer, dict)  # an ended worker's answer
                done[child] = answer | {"ended_at": self._ended_at[child]}
            else:
                pending[child] = {"status": self._watch.status(child) or "unknown"}
        new = sorted(c for c, a in done.items() if cursor is not None and a["ended_at"] > cursor)
        position = self._scanned
        return {
            "position": position,
            "cursor": position,
            "complete": not pending,
            "done": done,
            "pending": pending,
            "new": new,
        }

    def _projection(self) -> Projector:
        if self._projector is None:
            self._projector = self.charter.projector()
        self._projector.catch_up()
        return self._projector

    def budget(self) -> dict[str, Any]:
        with self._lock:
            report = self._projection().budgets(str(self.lineage))
        return report.to_json() | {"position": report.as_of}

    def subtree(self) -> dict[str, Any]:
        with self._lock:
            report = self._projection().tree(str(self.lineage))
        return report.to_json() | {"position": report.as_of}

    def revoke(self, params: RevokeParams) -> dict[str, Any]:
        target = _descendant(self.lineage, params.lineage)
        reason = params.reason or f"revoked by {self.lineage} through MCP"
        with self._lock:
            position = self.charter.revoke(target, reason)
            already = position is None
            if position is None:
                position = self._head()
        return {"lineage": str(target), "revoked": True, "already": already, "position": position}


class DoorFace:
    """The worker whose sandbox this server runs in: every call is its door's, the door
    identifying the worker by the kernel. ``worker``: what each child runs (the door
    schedules every child it spawns). A door has no projection reads: ``budget`` and
    ``subtree`` are refused. A door's ``wait`` holds its children until they end (and
    kills them if it stops waiting), so this face keeps that one wait open on its own
    connection while each tool call returns within its bound with what is known."""

    kind: ClassVar[str] = "worker"

    def __init__(self, path: str, worker: WorkerSpec | None, *, wait_s: float = 3600.0) -> None:
        self.path = path
        self.worker = worker
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._waits: dict[tuple[str, ...], _DoorWait] = {}
        self._lineage: str | None = None

    def close(self) -> None:
        """Nothing to close: each call opens its own connection to the door."""

    def _call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        with Door(self.path) as door:
            return door.call(method, params)

    def whoami(self) -> dict[str, Any]:
        found = self._call("whoami")
        self._lineage = str(found["lineage"])
        return {"lineage": self._lineage, "face": self.kind, "position": found.get("position")}

    def spawn(self, intent: SpawnIntent) -> dict[str, Any]:
        if self.worker is None:
            raise BadInputError(
                "a worker's door schedules every child it spawns: start `charter mcp` with "
                "--worker (what each child runs)"
            )
        found = self._call(
            "spawn",
            {
                "intent": intent.model_dump(mode="json", exclude_none=True),
                "workers": [self.worker.model_dump(mode="json", exclude_none=True)],
            },
        )
        return dict(found) | {"position": found.get("position"), "scheduled": True}

    def wait(self, params: WaitParams) -> dict[str, Any]:
        children = tuple(sorted(dict.fromkeys(params.children)))
        with self._lock:
            pending = self._waits.get(children)
            if pending is None:
                pending = self._waits[children] = _DoorWait(
                    lambda: self._call(
                        "wait", {"children": list(children), "timeout_s": self.wait_s}
                    )
                )
        answer = pending.result(params.timeout_s)
        if answer is None:  # not answered yet: the door reports no position meanwhile
            return {
                "position": None, "cursor": params.cursor, "complete": False, "done": {},
                "pending": {c: {"status": "live"} for c in children}, "new": [],
            }  # fmt: skip
        with self._lock:
            self._waits.pop(children, None)
        found = dict(answer["children"])
        timed_out = found.pop("timed_out", False)
        return {
            "position": answer.get("position"), "cursor": answer.get("position"),
            "complete": True, "timed_out": timed_out, "done": found, "pending": {},
            "new": sorted(found),
        }  # fmt: skip

    def budget(self) -> dict[str, Any]:
        raise NotThroughDoorError("a worker's door answers no budget reads; its parent can")

    def subtree(self) -> dict[str, Any]:
        raise NotThroughDoorError("a worker's door answers no tree reads; its parent can")

    def revoke(self, params: RevokeParams) -> dict[str, Any]:
        found = self._call("revoke", {"lineage": params.lineage, "reason": params.reason})
        return dict(found)


class _DoorWait:
    """One door ``wait`` running on its own thread until the children end."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._done = threading.Event()
        self._answer: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self._answer = call()
        except (DoorError, OSError) as e:
            self._error = e
        finally:
            self._done.set()

    def result(self, timeout_s: float) -> Any:
        if not self._done.wait(timeout_s):
            return None
        if self._error is not None:
            raise self._error
        return self._answer
