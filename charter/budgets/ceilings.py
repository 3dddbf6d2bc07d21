"""Fabric-wide population and depth ceilings: a pure check over what the registry says.

The check itself is fail-closed arithmetic; reading the registry is the spawn
pipeline's ceilings stage, which FAILS OPEN on a read error (DESIGN §5) and journals
:class:`CeilingCheckFailedOpen` in the fan-out's own append when it does.
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
    "DEFAULT_POPULATION_CEILING",
    "CeilingCheckFailedOpen",
    "FabricCeilings",
    "RegistryFacts",
    "check_ceilings",
]

DEFAULT_POPULATION_CEILING = 10_000
DEFAULT_DEPTH_CEILING = 8


class FabricCeilings(CheckedModel):
    """The configured ceilings (``CHARTER_POPULATION_CEILING``, ``CHARTER_DEPTH_CEILING``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    population: int = Field(default=DEFAULT_POPULATION_CEILING, ge=0, le=2**63 - 1)
    depth: int = Field(default=DEFAULT_DEPTH_CEILING, ge=0, le=MAX_LINEAGE_DEPTH)


class RegistryFacts(BaseModel):
    """What the registry says: the ceilings in force and the live worker population."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    population_ceiling: int = Field(ge=0)
    depth_ceiling: int = Field(ge=0)
    live_population: int = Field(ge=0)


class CeilingCheckFailedOpen(Event):
    """The fabric ceilings could not be read; the fan-out went ahead without them.

    Journaled in the same append as the fan-out, so auditors see every time it happened.
    """

    type_name = "CeilingCheckFailedOpen"
    fanout: str
    error: str


def check_ceilings(facts: RegistryFacts, parent: Lineage, width: int) -> RefusedError | None:
    """The refusal a fan-out of ``width`` children under ``parent`` meets, if any."""
    depth = len(parent.segments)  # a child is one segment deeper than its parent
    if depth > facts.depth_ceiling:
        return DepthCeilingError(
            f"workers at depth {depth} would exceed the fabric's depth ceiling of "
            f"{facts.depth_ceiling}"
        )
    if facts.live_population + width > facts.population_ceiling:
        return PopulationCeilingError(
            f"{facts.live_population} workers are live and {width} more would exceed the "
            f"fabric's population ceiling of {facts.population_ceiling}; retry when some "
            "have finished"
        )
    return None
