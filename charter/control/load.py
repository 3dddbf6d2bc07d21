"""The adaptive processing cap's inputs: how loaded this host is now."""

from __future__ import annotations

import os
from collections.abc import Callable

from charter.budgets import CapInputs

__all__ = ["HostLoad", "host_cap_inputs", "steady_load"]

HostLoad = Callable[[int, int], CapInputs]
"""The adaptive processing cap's inputs for a cell of (cores, failover reserve)."""


def host_cap_inputs(cores: int, failover_reserve: int) -> CapInputs:
    """The adaptive cap's inputs on this host: its load now, no live peers known."""
    return CapInputs(
        cores=cores,
        failover_reserve=failover_reserve,
        load_average=os.getloadavg()[0],
        live_peers=0,
    )


def steady_load(cores: int, reserve: int) -> CapInputs:
    """The adaptive cap's inputs WITHOUT the host's load average: only for a shared or
    busy machine where someone else's load would shrink this cell to nothing (the
    demo's ``--ignore-host-load``). Cores, reserve and the configured caps still hold."""
    return CapInputs(cores=cores, failover_reserve=reserve, load_average=0.0, live_peers=0)
