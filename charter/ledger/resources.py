"""Budgets and slots joined to fan-outs: leases in the same append as the mints.

:class:`ResourceView` folds the lease book and the cells from the journal incrementally
(as :class:`~charter.ledger.authority.AuthorityView` does for the directory), timing
each entry by its commit time. :func:`lease_extension` is the fan-out stage that carves
each minted child's lease out of its parent's remaining budget, or refuses the whole
fan-out (journaled) when it does not fit or the parent has no ledger.
"""

from __future__ import annotations

from collections.abc import Callable

from charter.ledger.admission import ADMISSION_EVENTS, Cells
from charter.ledger.authority import Extension, FanoutDecision, SpawnIntent
from charter.ledger.errors import RefusedError
from charter.ledger.journal import Committed, Journal
from charter.ledger.leases import LEASE_EVENTS, LeaseBook

__all__ = ["ResourceView", "default_stages", "lease_extension", "entry_ms"]

_TYPES = tuple(cls.type_name for cls in (*LEASE_EVENTS, *ADMISSION_EVENTS))


def entry_ms(recorded_at_seconds: float) -> int:
    return int(recorded_at_seconds * 1000)


class ResourceView:
    """The lease book and the cells as of ``position``, kept current from the journal."""

    def __init__(self) -> None:
        self.book = LeaseBook()
        self.cells = Cells()
        self.position = 0

    def refresh(self, journal: Journal) -> None:
        head = journal.head()
        if head is None or head[0] <= self.position:
            return
        for entry in journal.entries(start=self.position + 1, stop=head[0], types=_TYPES):
            self._apply(entry.event, entry_ms(entry.recorded_at.timestamp()))
        self.position = head[0]

    def applied(self, committed: tuple[Committed, ...], at_ms: int) -> None:
        """Fold our own commit at once when nothing else was written in between."""
        if committed and committed[0].position == self.position + 1:
            for c in committed:
                self._apply(c.event, at_ms)
            self.position = committed[-1].position

    def _apply(self, event: object, at_ms: int) -> None:
        if isinstance(event, LEASE_EVENTS):
            self.book.apply(event, at_ms)
        elif isinstance(event, ADMISSION_EVENTS):
            self.cells.apply(event)


def lease_extension(journal: Journal, view: ResourceView, clock: Callable[[], int]) -> Extension:
    """The fan-out stage that leases each child its grant's budget until it expires.

    Each child is leased ``estimated cost / width`` (capped by its grant's budget), for
    its wall-clock allocation, and never past its grant's expiry (nor, in
    :meth:`LeaseBook.decide_leases`, past its parent's lease). Leases go on the parent's
    stream, which the authority stage already pinned.
    """

    def extend(decision: FanoutDecision, intent: SpawnIntent) -> FanoutDecision:
        view.refresh(journal)
        now = clock()
        # The fan-out's estimated cost is split evenly; no child is leased more than its
        # grant's budget ceiling.
        share = intent.estimated_cost.split(intent.width)
        children = []
        for child in decision.children:
            allocation = share.minimum(child.grant.terms.budget)
            expires = min(child.grant.terms.expires_at_ms, now + allocation.wall_ms)
            children.append((str(child.lineage), allocation, expires))
        try:
            leases = view.book.decide_leases(str(decision.parent), children, now)
        except RefusedError as error:
            return decision.refused(error, str(decision.parent), intent)
        return decision.joined(leases)

    return extend


def default_stages(journal: Journal, clock: Callable[[], int]) -> list[Extension]:
    """The stages every fan-out goes through after the authority's own: leases."""
    return [lease_extension(journal, ResourceView(), clock)]
