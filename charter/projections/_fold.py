"""The projection fold: raw journal rows in, versioned SQL rows out (no database here).

Every projected value is a *versioned row*: ``valid_from`` is the position of the entry
that made it, ``valid_to`` the position of the entry that replaced it (NULL while it is
current). A query as of position ``p`` is then ``valid_from <= p AND (valid_to IS NULL
OR valid_to > p)``. The fold keeps only the current rows in memory and computes each
closed row completely before it is written, so a rebuild is insert-only; a row that was
already written open is closed with one UPDATE.

Only the event types projected here are decoded (``json.loads`` of the stored state),
the others are only counted. The fold mirrors :class:`charter.budgets.leases.LeaseBook`
and :class:`charter.budgets.admission.Cells`; the tests replay both and compare.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from charter.core.budget import Budget
from charter.core.clock import entry_ms
from charter.core.errors import UnknownEventTypeError

__all__ = ["AXES", "Changes", "Fold", "at_ms_of_state", "iso_to_ms"]

AXES = Budget.AXES


# Ledger row layout (the order of the columns of the ledgers table).
L_LINEAGE, L_FROM, L_TO, L_PARENT = 0, 1, 2, 3
L_ALLOC = 4  # 5 axes: 4..8
L_EXPIRES, L_RELEASED = 9, 10
L_SPENT = 11  # 5 axes: 11..15
L_EXHAUSTED = 16
LEDGER_COLUMNS = (
    "lineage",
    "valid_from",
    "valid_to",
    "parent",
    *(f"alloc_{a}" for a in AXES),
    "expires_at_ms",
    "released_at_ms",
    *(f"spent_{a}" for a in AXES),
    "exhausted",
)
CELL_COLUMNS = ("cell", "valid_from", "valid_to", "caps", "cores", "failover_reserve")
SLOT_COLUMNS = ("cell", "resource", "lineage", "valid_from", "valid_to")
NODE_COLUMNS = ("lineage", "parent", "depth", "kind", "position", "fanout")
# A scheduled worker's status, in the vocabulary of charter.control.WorkerStatus:
# queued | admitted | running | waiting | exited | failed | killed.
WORKER_COLUMNS = ("lineage", "valid_from", "valid_to", "cell", "status")
W_STATUS = 4
# A cell's newest incarnation and when its claim lapses (None: no bound): a reader
# derives from it, at its reading time, whether the cell is gone.
CLAIM_COLUMNS = ("cell", "valid_from", "valid_to", "incarnation", "until_ms")
# A live worker's latest usage so far (its newest ``WorkerSampled`` while it has not
# ended; the row is closed at its end, when its lease's charge says what it used).
SAMPLE_COLUMNS = ("lineage", "valid_from", "valid_to", "wall_ms", "cpu_ms", "memory_bytes")
# A lineage waiting for a slot; ``seq`` orders lineages queued by one event.
QUEUE_COLUMNS = ("cell", "resource", "lineage", "valid_from", "valid_to", "seq")
_PROCESSING = "processing"
_NOT_ENDED = frozenset({"queued", "admitted", "running", "waiting"})


def iso_to_ms(text: str) -> int:
    """A stored recorded_at timestamp as :func:`entry_ms` reads it (the same exact
    integer milliseconds the lease fold uses)."""
    return entry_ms(datetime.fromisoformat(text))


def at_ms_of_state(state: bytes) -> int:
    """The commit time (ms) stored in an entry's state (``{"at": iso, …}``)."""
    return iso_to_ms(json.loads(state)["at"])


def _budget(value: dict[str, int]) -> list[int]:
    return [int(value[a]) for a in AXES]


@dataclass
class Changes:
    """Rows to write, gathered since the last flush."""

    ledger_inserts: list[tuple[Any, ...]] = field(default_factory=list)
    ledger_closes: list[tuple[int, str]] = field(default_factory=list)
    cell_inserts: list[tuple[Any, ...]] = field(default_factory=list)
    cell_closes: list[tuple[int, str]] = field(default_factory=list)
    slot_inserts: list[tuple[Any, ...]] = field(default_factory=list)
    slot_closes: list[tuple[int, str, str, str]] = field(default_factory=list)
    node_inserts: list[tuple[Any, ...]] = field(default_factory=list)
    worker_inserts: list[tuple[Any, ...]] = field(default_factory=list)
    worker_closes: list[tuple[int, str]] = field(default_factory=list)
    queue_inserts: list[tuple[Any, ...]] = field(default_factory=list)
    queue_closes: list[tuple[int, str, str, str]] = field(default_factory=list)
    claim_inserts: list[tuple[Any, ...]] = field(default_factory=list)
    claim_closes: list[tuple[int, str]] = field(default_factory=list)
    sample_inserts: list[tuple[Any, ...]] = field(default_factory=list)
    sample_closes: list[tuple[int, str]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


class Fold:
    """The current rows of every projection, and the changes not yet written."""

    def __init__(self, position: int = 0) -> None:
        self.position = position
        self.ledgers: dict[str, list[Any]] = {}
        self.children: dict[str, dict[str, None]] = {}  # insertion-ordered sets
        self.cells: dict[str, list[Any]] = {}
        self.slots: dict[tuple[str, str, str], int] = {}  # open slot → valid_from
        self.workers: dict[str, list[Any]] = {}
        self.queue: dict[tuple[str, str, str], tuple[int, int]] = {}  # → valid_from, seq
        self.claims: dict[str, list[Any]] = {}
        self.samples: dict[str, list[Any]] = {}
        # Current rows that are already in the database (closing them is an UPDATE).
        self.persisted_ledgers: set[str] = set()
        self.persisted_cells: set[str] = set()
        self.persisted_slots: set[tuple[str, str, str]] = set()
        self.persisted_workers: set[str] = set()
        self.persisted_queue: set[tuple[str, str, str]] = set()
        self.persisted_claims: set[str] = set()
        self.persisted_samples: set[str] = set()
        self.changes = Changes()

    # -- loading the current rows of an existing projection --------------------------

    def load(
        self,
        ledgers: Iterable[Sequence[Any]],
        cells: Iterable[Sequence[Any]],
        slots: Iterable[Sequence[Any]],
        workers: Iterable[Sequence[Any]] = (),
        queue: Iterable[Sequence[Any]] = (),
        claims: Iterable[Sequence[Any]] = (),
        samples: Iterable[Sequence[Any]] = (),
    ) -> None:
        for row in ledgers:
            lineage = row[L_LINEAGE]
            self.ledgers[lineage] = list(row)
            self.persisted_ledgers.add(lineage)
        for row in sorted(self.ledgers.values(), key=lambda r: r[L_FROM]):
            if row[L_PARENT] is not None:
                self.children.setdefault(row[L_PARENT], {})[row[L_LINEAGE]] = None
        for row in cells:
            self.cells[row[0]] = list(row)
            self.persisted_cells.add(row[0])
        for cell, resource, lineage, valid_from, _ in slots:
            self.slots[cell, resource, lineage] = valid_from
            self.persisted_slots.add((cell, resource, lineage))
        for row in workers:
            self.workers[row[0]] = list(row)
            self.persisted_workers.add(row[0])
        for cell, resource, lineage, valid_from, _, seq in queue:
            self.queue[cell, resource, lineage] = (valid_from, seq)
            self.persisted_queue.add((cell, resource, lineage))
        for row in claims:
            self.claims[row[0]] = list(row)
            self.persisted_claims.add(row[0])
        for row in samples:
            self.samples[row[0]] = list(row)
            self.persisted_samples.add(row[0])

    # -- versioning ----------------------------------------------------------------

    def _next_ledger(self, lineage: str, position: int) -> list[Any]:
        """Close the current version of ``lineage`` at ``position``; return the new one."""
        old = self.ledgers[lineage]
        if lineage in self.persisted_ledgers:
            self.persisted_ledgers.discard(lineage)
            self.changes.ledger_closes.append((position, lineage))
        else:
            old[L_TO] = position
            self.changes.ledger_inserts.append(tuple(old))
        new = old.copy()
        new[L_FROM] = position
        new[L_TO] = None
        self.ledgers[lineage] = new
        return new

    def _replace_ledger(self, row: list[Any], position: int) -> None:
        lineage = row[L_LINEAGE]
        if lineage in self.ledgers:
            self._next_ledger(lineage, position)
        self.ledgers[lineage] = row
        parent = row[L_PARENT]
        if parent is not None:
            self.children.setdefault(parent, {})[lineage] = None

    def _close_slot(self, key: tuple[str, str, str], position: int) -> None:
        valid_from = self.slots.pop(key)
        if key in self.persisted_slots:
            self.persisted_slots.discard(key)
            self.changes.slot_closes.append((position, *key))
        else:
            self.changes.slot_inserts.append((*key, valid_from, position))

    def _close_queued(self, key: tuple[str, str, str], position: int) -> None:
        valid_from, seq = self.queue.pop(key)
        if key in self.persisted_queue:
            self.persisted_queue.discard(key)
            self.changes.queue_closes.append((position, *key))
        else:
            self.changes.queue_inserts.append((*key, valid_from, position, seq))

    def _worker_status(self, lineage: str, status: str, position: int) -> None:
        """A new version of ``lineage``'s worker row with ``status``."""
        old = self.workers[lineage]
        if lineage in self.persisted_workers:
            self.persisted_workers.discard(lineage)
            self.changes.worker_closes.append((position, lineage))
        else:
            old[2] = position
            self.changes.worker_inserts.append(tuple(old))
        self.workers[lineage] = [lineage, position, None, old[3], status]

    def _node(self, lineage: str, position: int, fanout: str | None) -> None:
        cut = lineage.rfind("/")
        parent = lineage[:cut] if cut >= 0 else None
        kind = "agent" if parent is None else "worker"
        self.changes.node_inserts.append(
            (lineage, parent, lineage.count("/"), kind, position, fanout)
        )

    # -- the fold --------------------------------------------------------------------

    def apply_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Fold raw journal rows ``(position, topic, state)`` (``Journal.payloads``)."""
        counts = self.changes.counts
        loads = orjson.loads
        kinds = _KINDS
        for position, topic, state in rows:
            kind = kinds.get(topic)
            if kind is None:
                kind = kinds[topic] = _kind(topic)
            name, handler = kind
            counts[name] = counts.get(name, 0) + 1
            if handler is None:
                continue
            if handler is _MINTED:
                self._grant_minted(position, _minted_fields(state), "")
            else:
                data = loads(state)
                handler(self, position, data["payload"], data["at"])
        if rows:
            self.position = rows[-1][0]

    def _ledger_opened(self, position: int, p: dict[str, Any], at: str) -> None:
        """A root's budget ledger is write-once: a second one (which would reset the
        root's budget) is not projected; ``charter audit`` reports it (trust-anchor)."""
        del at
        if p["lineage"] in self.ledgers:
            return
        row = [p["lineage"], position, None, None, *_budget(p["allocation"]), None, None]
        row += [0, 0, 0, 0, 0, 0]
        self._replace_ledger(row, position)

    def _lease_granted(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        allocation = _budget(p["allocation"])
        expires = int(p["expires_at_ms"])
        for lineage in p["lineages"]:  # one event carries a fan-out's identical leases
            row = [lineage, position, None, p["parent"], *allocation]
            row += [expires, None, 0, 0, 0, 0, 0, 0]
            self._replace_ledger(row, position)

    def _usage(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        row = self._next_ledger(p["lineage"], position)
        amount = p["amount"]
        # Unrolled over AXES (the commonest event of a long journal).
        row[L_SPENT] += int(amount["tokens"])
        row[L_SPENT + 1] += int(amount["wall_ms"])
        row[L_SPENT + 2] += int(amount["cpu_ms"])
        row[L_SPENT + 3] += int(amount["mem_bytes"])
        row[L_SPENT + 4] += int(amount["egress_bytes"])
        if p["exhausted"]:
            row[L_EXHAUSTED] = 1

    def _released(self, position: int, p: dict[str, Any], at: str) -> None:
        at_ms = iso_to_ms(at)
        stack = [p["lineage"]]
        while stack:
            lineage = stack.pop()
            if self.ledgers[lineage][L_RELEASED] is None:
                self._next_ledger(lineage, position)[L_RELEASED] = at_ms
            stack.extend(self.children.get(lineage, ()))

    def _renewed(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        self._next_ledger(p["lineage"], position)[L_EXPIRES] = int(p["expires_at_ms"])

    def _cell_configured(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        cell = p["cell"]
        if cell in self.cells:
            # Reconfigured: new caps, and the slots held stay held (as in Cells.apply).
            old = self.cells[cell]
            if cell in self.persisted_cells:
                self.persisted_cells.discard(cell)
                self.changes.cell_closes.append((position, cell))
            else:
                old[2] = position
                self.changes.cell_inserts.append(tuple(old))
        caps = json.dumps(p["caps"], sort_keys=True, separators=(",", ":"))
        self.cells[cell] = [cell, position, None, caps, p["cores"], p["failover_reserve"]]

    def _slot_admitted(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        key = (p["cell"], p["resource"], p["lineage"])
        if key not in self.slots:
            self.slots[key] = position
        if key in self.queue:
            self._close_queued(key, position)
        worker = self.workers.get(p["lineage"])
        if p["resource"] == _PROCESSING and worker is not None:
            # Out of the queue; a waiting coordinator holding processing again runs.
            after = {"queued": "admitted", "waiting": "running"}.get(str(worker[W_STATUS]))
            if after is not None:
                self._worker_status(p["lineage"], after, position)

    def _slot_queued(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        for seq, lineage in enumerate(p["lineages"]):
            key = (p["cell"], p["resource"], lineage)
            if key not in self.queue:
                self.queue[key] = (position, seq)
            worker = self.workers.get(lineage)
            if (
                p["resource"] == _PROCESSING
                and worker is not None
                and worker[W_STATUS] == "admitted"
            ):
                self._worker_status(lineage, "queued", position)

    def _worker_scheduled(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        lineage, cell = p["lineage"], p["cell"]
        queued = (cell, _PROCESSING, lineage) in self.queue
        row = [lineage, position, None, cell, "queued" if queued else "admitted"]
        if lineage in self.workers:  # moved off a gone cell: replace, do not fork
            self._worker_status(lineage, str(row[W_STATUS]), position)
            self.workers[lineage][3] = cell  # its new cell (docs/fabric.md)
        else:
            self.workers[lineage] = row

    def _worker_started(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        if p["lineage"] in self.workers:
            self._worker_status(p["lineage"], "running", position)

    def _worker_waiting(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        if p["lineage"] in self.workers:
            self._worker_status(p["lineage"], "waiting", position)

    def _claim(self, cell: str, incarnation: int, until: int | None, position: int) -> None:
        """A new version of ``cell``'s claim row."""
        old = self.claims.get(cell)
        if old is not None:
            if cell in self.persisted_claims:
                self.persisted_claims.discard(cell)
                self.changes.claim_closes.append((position, cell))
            else:
                old[2] = position
                self.changes.claim_inserts.append(tuple(old))
        self.claims[cell] = [cell, position, None, incarnation, until]

    def _cell_started(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        self._claim(p["cell"], int(p["incarnation"]), p.get("claim_until_ms"), position)

    def _claim_renewed(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        current = self.claims.get(p["cell"])
        if current is not None and current[3] == p["incarnation"]:
            self._claim(p["cell"], int(p["incarnation"]), int(p["until_ms"]), position)

    def _worker_ended(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        if p["lineage"] in self.workers:
            self._worker_status(p["lineage"], str(p["outcome"]), position)
        self._close_sample(p["lineage"], position)  # its charge says what it used now

    def _close_sample(self, lineage: str, position: int) -> None:
        old = self.samples.pop(lineage, None)
        if old is None:
            return
        if lineage in self.persisted_samples:
            self.persisted_samples.discard(lineage)
            self.changes.sample_closes.append((position, lineage))
        else:
            old[2] = position
            self.changes.sample_inserts.append(tuple(old))

    def _worker_sampled(self, position: int, p: dict[str, Any], at: str) -> None:
        """A live worker's usage so far (as the cell's view folds it: only while the
        worker has not ended)."""
        del at
        lineage = p["lineage"]
        worker = self.workers.get(lineage)
        if worker is None or worker[W_STATUS] not in _NOT_ENDED:
            return
        self._close_sample(lineage, position)
        self.samples[lineage] = [
            lineage, position, None, int(p["wall_ms"]), int(p["cpu_ms"]), int(p["memory_bytes"])
        ]  # fmt: skip

    def _slot_released(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        key = (p["cell"], p["resource"], p["lineage"])
        if key in self.slots:
            self._close_slot(key, position)
        if key in self.queue:  # a queued worker moved to another cell leaves the queue
            self._close_queued(key, position)

    def _agent_registered(self, position: int, p: dict[str, Any], at: str) -> None:
        """The first registration's node stays (nodes are inserted or ignored)."""
        del at
        self._node(p["lineage"], position, None)

    def _grant_minted(self, position: int, p: dict[str, Any], at: str) -> None:
        del at
        if p["lineage"] != p["issuer"]:  # a root's ceiling grant is self-issued
            self._node(p["lineage"], position, p["fanout"])

    # -- handing over what to write --------------------------------------------------

    def take(self, *, final: bool) -> Changes:
        """The changes to write now; with ``final`` also every current row not yet in
        the database (so that a commit leaves the tables complete)."""
        changes = self.changes
        self.changes = Changes()
        if final:
            self._persist_all(changes)
        return changes

    def _persist_all(self, changes: Changes) -> None:
        """Add to ``changes`` every current row not yet in the database."""
        versioned: tuple[tuple[dict[str, list[Any]], set[str], list[tuple[Any, ...]]], ...] = (
            (self.ledgers, self.persisted_ledgers, changes.ledger_inserts),
            (self.cells, self.persisted_cells, changes.cell_inserts),
            (self.workers, self.persisted_workers, changes.worker_inserts),
            (self.claims, self.persisted_claims, changes.claim_inserts),
            (self.samples, self.persisted_samples, changes.sample_inserts),
        )
        for rows, persisted, inserts in versioned:
            for name, row in rows.items():
                if name not in persisted:
                    inserts.append(tuple(row))
                    persisted.add(name)
        for key, valid_from in self.slots.items():
            if key not in self.persisted_slots:
                changes.slot_inserts.append((*key, valid_from, None))
                self.persisted_slots.add(key)
        for key, (valid_from, seq) in self.queue.items():
            if key not in self.persisted_queue:
                changes.queue_inserts.append((*key, valid_from, None, seq))
                self.persisted_queue.add(key)


# A GrantMinted entry is canonical JSON with sorted keys: {"at":…,"payload":{"body":
# "<the sealed grant, escaped>","fanout":…,"issuer":…,"lineage":…,"signature":…}}. The
# tree needs only the small fields after the body; inside the escaped body every quote
# is written \", so the first unescaped '","fanout":"' ends it. Decoding just the tail
# skips parsing ~1 KB of grant per entry.
_FANOUT_KEY = b'","fanout":"'


def _minted_fields(state: bytes) -> dict[str, Any]:
    cut = state.find(_FANOUT_KEY)
    if cut < 0:  # not the shape above: decode it all
        payload: dict[str, Any] = orjson.loads(state)["payload"]
        return payload
    tail: dict[str, Any] = orjson.loads(b"{" + state[cut + 2 : -1])
    return tail


_Handler = Callable[["Fold", int, dict[str, Any], str], None]

_HANDLERS: dict[str, _Handler] = {
    "BudgetLedgerOpened": Fold._ledger_opened,
    "LeaseGranted": Fold._lease_granted,
    "UsageRecorded": Fold._usage,
    "LeaseReleased": Fold._released,
    "LeaseRenewed": Fold._renewed,
    "CellConfigured": Fold._cell_configured,
    "SlotAdmitted": Fold._slot_admitted,
    "SlotReleased": Fold._slot_released,
    "SlotQueued": Fold._slot_queued,
    "WorkerScheduled": Fold._worker_scheduled,
    "WorkerStarted": Fold._worker_started,
    "WorkerWaiting": Fold._worker_waiting,
    "CellStarted": Fold._cell_started,
    "CellClaimRenewed": Fold._claim_renewed,
    "WorkerEnded": Fold._worker_ended,
    "WorkerSampled": Fold._worker_sampled,
    "AgentRegistered": Fold._agent_registered,
    "GrantMinted": Fold._grant_minted,
}
# The stored version of each type its handler was written for. A handler reads raw
# payload keys, so a new version of a type needs its handler (and this entry) updated.
_HANDLED_VERSION = "1"
_MINTED = _HANDLERS["GrantMinted"]
# topic -> (type name, handler or None): the few topics a journal holds, parsed once.
_KINDS: dict[str, tuple[str, _Handler | None]] = {}


def _kind(topic: str) -> tuple[str, _Handler | None]:
    name, _, version = topic.partition("/v")
    handler = _HANDLERS.get(name)
    if handler is not None and version != _HANDLED_VERSION:
        # A type projected here but at a version this Charter does not know (say
        # GrantMinted/v9): its payload may mean something else, so folding it would
        # give wrong budgets. UnknownEventTypeError says so, never a KeyError.
        raise UnknownEventTypeError(
            f"journal entry has event type {topic!r}, which this Charter's projections do "
            f"not know (they read {name}/v{_HANDLED_VERSION}); upgrade Charter to read it"
        )
    return name, handler
