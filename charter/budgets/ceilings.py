"""Fabric-wide population and depth ceilings: a pure check over what the registry says.

The check itself is fail-closed arithmetic; reading the registry is the spawn
pipeline's ceilings stage, which FAILS OPEN on a read error (DESIGN §5) and journals
:class:`CeilingCheckFailedOpen` in the fan-out's own append when it does.

A population ceiling is exact across the fabric: every fan-out that adds live workers
under a configured ceiling appends :class:`PopulationGrew` on the one fabric-wide
stream :data:`POPULATION_STREAM`, pinned to the version its count was read at, so two
fan-outs decided on the same count (under any two roots, in any two processes) conflict
and the later one is decided again on the count now (docs/fabric.md).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from charter.budgets.errors import DepthCeilingError, PopulationCeilingError
from charter.core import CheckedModel
from charter.core.errors import RefusedError
from charter.core.events import Event
from charter.core.lineage import MAX_LINEAGE_DEPTH, Lineage

__all__ = [
    "DEFAULT_DEPTH_CEILING",
    "POPULATION_STREAM",
    "CeilingCheckFailedOpen",
    "FabricCeilings",
    "PopulationGrew",
    "RegistryFacts",
    "check_ceilings",
]

DEFAULT_DEPTH_CEILING = 8
POPULATION_STREAM = "fabric:population"
"""The one stream every fan-out under a configured population ceiling writes and pins."""


class FabricCeilings(CheckedModel):
    """The configured ceilings (``CHARTER_POPULATION_CEILING``, ``CHARTER_DEPTH_CEILING``).

    ``population`` None: no population ceiling (nothing counted, nothing serialized);
    a number: at most that many live workers in the whole fabric, exactly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    population: int | None = Field(default=None, ge=0, le=2**63 - 1)
    depth: int = Field(default=DEFAULT_DEPTH_CEILING, ge=0, le=MAX_LINEAGE_DEPTH)


class RegistryFacts(BaseModel):
    """What the registry says: the ceilings in force and the live worker population."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    population_ceiling: int | None = Field(ge=0)  # None: no population ceiling
    depth_ceiling: int = Field(ge=0)
    live_population: int = Field(ge=0)


class CeilingCheckFailedOpen(Event):
    """The fabric ceilings could not be read; the fan-out went ahead without them.

    Journaled in the same append as the fan-out, so auditors see every time it happened.
    """

    type_name = "CeilingCheckFailedOpen"
    fanout: str
    error: str


class PopulationGrew(Event):
    """A fan-out added ``width`` live workers under a population ceiling: ``live`` is
    the fabric's live count after it, ``ceiling`` the ceiling in force when it was
    decided. On :data:`POPULATION_STREAM`, in the fan-out's own append, pinned to the
    version the count was read at: the point that serializes the fabric's growth."""

    type_name = "PopulationGrew"
    fanout: str
    live: int = Field(ge=0)
    width: int = Field(ge=1)
    ceiling: int = Field(ge=0)

    def stream(self) -> str:
        return POPULATION_STREAM


def check_ceilings(facts: RegistryFacts, parent: Lineage, width: int) -> RefusedError | None:
    """The refusal a fan-out of ``width`` children under ``parent`` meets, if any."""
    depth = len(parent.segments)  # a child is one segment deeper than its parent
    if depth > facts.depth_ceiling:
        return DepthCeilingError(
            f"workers at depth {depth} would exceed the fabric's depth ceiling of "
            f"{facts.depth_ceiling}"
        )
    if facts.population_ceiling is None:
        return None
    if facts.live_population + width > facts.population_ceiling:
        return PopulationCeilingError(
            f"{facts.live_population} workers are live and {width} more would exceed the "
            f"fabric's population ceiling of {facts.population_ceiling}; retry when some "
            "have finished"
        )
    return None
