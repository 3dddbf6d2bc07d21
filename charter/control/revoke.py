"""Revoking a lineage: one append, pinned to the lineage's stream, after which neither
it nor anything below it may spawn, be admitted or start; the cell that runs them kills
what of them runs (each kill journaled first) and returns their leases after charging
what they used."""

from __future__ import annotations

from charter.authority import LineageRevoked
from charter.control.handler import Pinned, append_pinned
from charter.control.views import Views
from charter.core import BadInputError, Lineage
from charter.ledger import Committed, Journal

__all__ = ["revoke"]


def revoke(journal: Journal, views: Views, lineage: Lineage, reason: str) -> Committed | None:
    """Revoke ``lineage`` (a worker) and its subtree; None if it already was (the first
    revocation stands). A fan-out anywhere below pins every ancestor's stream, this one
    included, so one decided before the revocation commits before it or not at all."""
    if lineage.is_root:
        raise BadInputError(
            f"{lineage} is a durable agent; revoke its workers (agent:NAME/sa-N) instead"
        )

    def decide(versions: dict[str, int]) -> Pinned | None:
        if lineage not in views.authority.digests:
            raise BadInputError(
                f"no grant was minted for {lineage!r}; nothing was journaled (`charter tree` "
                "lists the lineages)"
            )
        if views.authority.revoked_above(lineage) is not None:
            return None
        return Pinned([LineageRevoked(lineage=lineage, reason=reason)], versions)

    done = append_pinned(journal, views, [str(lineage)], decide, what=f"revoking {lineage}")
    return None if done is None else done[1][0]
