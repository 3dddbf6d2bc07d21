"""Admission: per-cell slots per resource class, never oversubscribed.

A cell has caps per resource class (processing, egress, inference, coordination). A
worker is admitted to a slot only if the class is under its cap; over the cap is
backpressure: a refusal that says when to retry, never an extra slot. A coordinator
that waits on its children gives back its processing slot and holds a coordination
slot instead, so a deep tree cannot deadlock on processing slots.

The processing cap is adaptive: cores minus a failover reserve, throttled by host load,
reduced by live peers on the cell. Every input is recorded in the decision's event.
Decisions are appended pinned to the cell's stream, so two concurrent admitters cannot
both take the last slot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from charter.budgets.errors import AdmissionRefusedError, UnknownCellError
from charter.core.budget import INT64_MAX
from charter.core.errors import BadInputError, StateError
from charter.core.events import Event
from charter.core.text import shown

__all__ = [
    "ResourceClass",
    "CapInputs",
    "CellConfigured",
    "SlotAdmitted",
    "SlotReleased",
    "AdmissionRefused",
    "ADMISSION_EVENTS",
    "CellState",
    "Cells",
    "processing_cap",
    "SlotQueued",
]


class ResourceClass(StrEnum):
    PROCESSING = "processing"
    EGRESS = "egress"
    INFERENCE = "inference"
    COORDINATION = "coordination"


class CapInputs(BaseModel):
    """Everything the adaptive processing cap was computed from (journaled with it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cores: int = Field(ge=0)
    failover_reserve: int = Field(ge=0)
    load_average: float = Field(ge=0)
    live_peers: int = Field(ge=0)


def processing_cap(inputs: CapInputs, configured: int) -> int:
    """``min(configured, cores − reserve − peers)``, scaled down when load exceeds cores."""
    base = inputs.cores - inputs.failover_reserve - inputs.live_peers
    if inputs.cores > 0 and inputs.load_average > inputs.cores:
        base = math.floor(base * inputs.cores / inputs.load_average)
    return max(0, min(configured, base))


class CellConfigured(Event):
    """A cell's static caps per class (processing is further capped adaptively)."""

    type_name = "CellConfigured"
    cell: str
    caps: dict[ResourceClass, int]
    cores: int = Field(ge=0)
    failover_reserve: int = Field(ge=0)

    def stream(self) -> str:
        return f"cell:{self.cell}"


class SlotAdmitted(Event):
    """``lineage`` holds a slot of ``resource`` on ``cell``; ``cap`` was in force."""

    type_name = "SlotAdmitted"
    cell: str
    lineage: str
    resource: ResourceClass
    cap: int = Field(ge=0)
    occupancy: int = Field(ge=1, description="Occupancy of the class after admission.")
    inputs: CapInputs | None = None

    def stream(self) -> str:
        return f"cell:{self.cell}"


class SlotReleased(Event):
    type_name = "SlotReleased"
    cell: str
    lineage: str
    resource: ResourceClass

    def stream(self) -> str:
        return f"cell:{self.cell}"


class SlotQueued(Event):
    """``lineages`` wait, in this order, for a slot of ``resource`` on ``cell`` (the
    class was full, or the cell is not configured yet): backpressure that never
    oversubscribes. The queue is first come, first served; a queued worker is admitted
    by a later SlotAdmitted. One event per fan-out, like its leases (decision 0003)."""

    type_name = "SlotQueued"
    cell: str
    lineages: tuple[str, ...] = Field(min_length=1)
    resource: ResourceClass
    cap: int = Field(ge=0)
    occupancy: int = Field(ge=0)

    def stream(self) -> str:
        return f"cell:{self.cell}"


class AdmissionRefused(Event):
    """Backpressure, journaled: the class was full."""

    type_name = "AdmissionRefused"
    cell: str
    lineage: str
    resource: ResourceClass
    cap: int
    occupancy: int
    retry_after_ms: int
    inputs: CapInputs | None = None


ADMISSION_EVENTS = (CellConfigured, SlotAdmitted, SlotQueued, SlotReleased, AdmissionRefused)


@dataclass
class CellState:
    name: str
    caps: dict[ResourceClass, int]
    cores: int
    failover_reserve: int
    holders: dict[ResourceClass, set[str]] = field(
        default_factory=lambda: {r: set() for r in ResourceClass}
    )
    # Waiting lineages per class, in arrival order (a dict keeps insertion order).
    queued: dict[ResourceClass, dict[str, None]] = field(
        default_factory=lambda: {r: {} for r in ResourceClass}
    )

    def occupancy(self, resource: ResourceClass) -> int:
        return len(self.holders[resource])


class Cells:
    """Every cell's slots, folded from admission events in journal order."""

    RETRY_AFTER_MS: ClassVar[int] = 250

    def __init__(self) -> None:
        self._cells: dict[str, CellState] = {}

    def get(self, cell: str) -> CellState:
        state = self._cells.get(cell)
        if state is None:
            raise UnknownCellError(f"no cell '{shown(cell)}' is configured; configure it first")
        return state

    def cells(self) -> Mapping[str, CellState]:
        return self._cells

    def apply(self, event: Event) -> None:
        match event:
            case CellConfigured():
                state = CellState(event.cell, dict(event.caps), event.cores, event.failover_reserve)
                old = self._cells.get(event.cell)
                if old is not None:  # reconfigured: holders still run, the queue still waits
                    state.holders, state.queued = old.holders, old.queued
                self._cells[event.cell] = state
            case SlotQueued():
                queue = self._unconfigured(event.cell).queued[event.resource]
                queue.update(dict.fromkeys(event.lineages))
            case SlotAdmitted():
                state = self._cells[event.cell]
                state.holders[event.resource].add(event.lineage)
                state.queued[event.resource].pop(event.lineage, None)
            case SlotReleased():  # a holder gives its slot back, or a queued one leaves
                state = self._cells[event.cell]
                state.holders[event.resource].discard(event.lineage)
                state.queued[event.resource].pop(event.lineage, None)
            case _:
                pass

    def _unconfigured(self, cell: str) -> CellState:
        """The cell, or a placeholder with no caps that holds a queue until it is
        configured (a fan-out may be scheduled on a cell that has not started yet)."""
        state = self._cells.get(cell)
        if state is None:
            state = self._cells[cell] = CellState(cell, {}, 0, 0)
        return state

    def cap(
        self, cell: str, resource: ResourceClass, inputs: CapInputs | None
    ) -> tuple[int, CapInputs | None]:
        state = self.get(cell)
        configured = state.caps.get(resource, 0)
        if resource is ResourceClass.PROCESSING:
            if inputs is None:
                raise BadInputError("the processing cap needs host inputs (load, live peers)")
            if (inputs.cores, inputs.failover_reserve) != (state.cores, state.failover_reserve):
                raise BadInputError(
                    f"cap inputs give {inputs.cores} cores and a reserve of "
                    f"{inputs.failover_reserve}, but cell '{shown(cell)}' is configured with "
                    f"{state.cores} and {state.failover_reserve}; reconfigure the cell first"
                )
            return processing_cap(inputs, configured), inputs
        return configured, None

    def decide_admit(
        self,
        cell: str,
        lineages: list[str],
        resource: ResourceClass,
        inputs: CapInputs | None = None,
    ) -> tuple[SlotAdmitted, ...]:
        """Slots for all of ``lineages`` (all or none), or :class:`AdmissionRefusedError`
        (carrying the :class:`AdmissionRefused` event to journal for it).

        Admission of one holder is idempotent: a lineage that already holds a slot of
        ``resource``, or is named twice, is admitted once (an empty answer when every
        one of them already holds one: nothing to append)."""
        state = self.get(cell)
        cap, used_inputs = self.cap(cell, resource, inputs)
        held = state.holders[resource]
        # dict.fromkeys: each lineage once, in the order asked (a set would reorder).
        fresh = [lin for lin in dict.fromkeys(lineages) if lin not in held]
        if not fresh:  # nothing to admit is never refused (even over an adaptive cap)
            return ()
        occupancy = len(held)
        if occupancy + len(fresh) > cap:
            retry = self.RETRY_AFTER_MS
            raise AdmissionRefusedError(
                f"cell '{shown(cell)}' has {occupancy} of {cap} {resource} slot(s) taken and "
                f"{len(fresh)} more were asked for; retry after {retry} ms",
                retry_after_ms=retry,
                refusal=AdmissionRefused(
                    cell=cell,
                    lineage=fresh[0],
                    resource=resource,
                    cap=cap,
                    occupancy=occupancy,
                    retry_after_ms=retry,
                    inputs=used_inputs,
                ),
            )
        events = []
        for lineage in fresh:
            occupancy += 1
            events.append(
                SlotAdmitted(
                    cell=cell,
                    lineage=lineage,
                    resource=resource,
                    cap=cap,
                    occupancy=occupancy,
                    inputs=used_inputs,
                )
            )
        return tuple(events)

    def decide_place(
        self,
        cell: str,
        lineages: list[str],
        resource: ResourceClass,
        inputs: CapInputs | None = None,
    ) -> tuple[SlotAdmitted | SlotQueued, ...]:
        """A fan-out's placement: a slot for each child while the class has room and
        nobody is queued ahead, the rest queued in order. Never over the cap."""
        state = self._cells.get(cell)
        if state is None or not state.caps:
            cap, used_inputs, held, waiting = 0, None, set[str](), {}
        else:
            cap, used_inputs = self.cap(cell, resource, inputs)
            held, waiting = state.holders[resource], state.queued[resource]
        occupancy = len(held)
        events: list[SlotAdmitted | SlotQueued] = []
        queued: list[str] = []
        for lineage in dict.fromkeys(lineages):  # a lineage named twice is placed once
            if lineage in held or lineage in waiting:
                continue
            if occupancy < cap and not waiting and not queued:
                occupancy += 1
                events.append(
                    SlotAdmitted(
                        cell=cell,
                        lineage=lineage,
                        resource=resource,
                        cap=cap,
                        occupancy=occupancy,
                        inputs=used_inputs,
                    )
                )
            else:
                queued.append(lineage)  # and every later child queues behind it
        if queued:
            events.append(
                SlotQueued(
                    cell=cell,
                    lineages=tuple(queued),
                    resource=resource,
                    cap=cap,
                    occupancy=occupancy,
                )
            )
        return tuple(events)

    def refusal(
        self,
        cell: str,
        lineage: str,
        resource: ResourceClass,
        error: AdmissionRefusedError,
        inputs: CapInputs | None = None,
    ) -> AdmissionRefused:
        state = self.get(cell)
        cap, used_inputs = self.cap(cell, resource, inputs)
        return AdmissionRefused(
            cell=cell,
            lineage=lineage,
            resource=resource,
            cap=cap,
            occupancy=state.occupancy(resource),
            retry_after_ms=error.retry_after_ms,
            inputs=used_inputs,
        )

    def decide_configure(
        self, cell: str, caps: dict[ResourceClass, int], *, cores: int, failover_reserve: int
    ) -> CellConfigured:
        """A (re)configuration; a cap below the slots already held is refused (the
        holders keep their slots, so the cap would be exceeded at once). Every number
        is a whole number from 0 to 2^63 − 1 (what a projection stores), else bad input."""
        numbers = {f"the {r} cap": n for r, n in caps.items()}
        numbers |= {"cores": cores, "the failover reserve": failover_reserve}
        for what, n in numbers.items():
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= INT64_MAX:
                raise BadInputError(
                    f"cell '{shown(cell)}': {shown(what)} must be a whole number from 0 to "
                    f"{INT64_MAX}, not {shown(repr(n))}"
                )
        state = self._cells.get(cell)
        if state is not None:
            for resource, held in state.holders.items():
                if len(held) > caps.get(resource, 0):
                    raise StateError(
                        f"cell '{shown(cell)}' has {len(held)} {resource} slot(s) held; a cap of "
                        f"{caps.get(resource, 0)} is below that (release slots first)"
                    )
        return CellConfigured(cell=cell, caps=caps, cores=cores, failover_reserve=failover_reserve)

    def decide_release(self, cell: str, lineage: str, resource: ResourceClass) -> SlotReleased:
        if lineage not in self.get(cell).holders[resource]:
            raise StateError(f"{shown(lineage)} holds no {resource} slot on cell '{shown(cell)}'")
        return SlotReleased(cell=cell, lineage=lineage, resource=resource)

    def decide_leave(self, cell: str, lineage: str, resource: ResourceClass) -> SlotReleased:
        """``lineage`` leaves ``cell`` for another (moved off a gone cell): its slot of
        ``resource`` given back, or its place in the queue."""
        state = self.get(cell)
        if lineage not in state.holders[resource] and lineage not in state.queued[resource]:
            raise StateError(
                f"{shown(lineage)} holds no {resource} slot on cell '{shown(cell)}' and is "
                "not queued there"
            )
        return SlotReleased(cell=cell, lineage=lineage, resource=resource)

    def decide_wait_on_children(
        self, cell: str, lineage: str
    ) -> tuple[SlotReleased, *tuple[SlotAdmitted, ...]]:
        """A coordinator waiting on children: give back processing, take coordination
        (unless it already holds a coordination slot). With the coordination class
        full, :class:`AdmissionRefusedError`: the coordinator keeps its processing slot,
        and the caller journals ``error.refusal`` (the swap's refusal, for coordination)."""
        release = self.decide_release(cell, lineage, ResourceClass.PROCESSING)
        return (release, *self.decide_admit(cell, [lineage], ResourceClass.COORDINATION))
