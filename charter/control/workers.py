"""Workers as the unit of a fan-out: what each child runs, scheduled in the fan-out's
own append.

A spawn may name, for each child, the program it runs (``argv``) and its inputs (extra
arguments appended to ``argv`` when it starts). The fan-out's append then holds one
:class:`WorkerScheduled` per child, next to its grant, lease and slot, so a cell never
runs anything that was not decided and committed with its authority. A fan-out without
workers (the operator's ``charter spawn``) schedules nothing, as before; journals
written before this event existed read unchanged.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from charter.core import CheckedModel
from charter.core.events import Event
from charter.core.framing import worker_inputs_digest

__all__ = [
    "MAX_ARG_BYTES",
    "MAX_ARGS",
    "WorkerScheduled",
    "WorkerSpec",
    "inputs_digest",
]

MAX_ARGS = 256
MAX_ARG_BYTES = 16 * 1024

Arg = Annotated[str, StringConstraints(min_length=0, max_length=MAX_ARG_BYTES)]


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

    @model_validator(mode="after")
    def _absolute_program(self) -> WorkerSpec:
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

    def stream(self) -> str:
        return worker_stream(self.lineage)

    @property
    def command(self) -> tuple[str, ...]:
        return (*self.argv, *self.inputs)


def worker_stream(lineage: str) -> str:
    """The stream a worker's schedule and lifecycle go on."""
    return f"worker:{lineage}"


__all__ += ["worker_stream"]
