"""The authority view: the directory and what has been minted, folded from the journal.

The fold is idempotent (re-reading an entry changes nothing), so the view can apply its
own committed events at once and still re-read safely. It is only ever used together
with a pinned append: a decision taken on a stale view fails to commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from charter.ledger.authority._events import AgentRegistered, GrantMinted
from charter.ledger.authority._lineage import Lineage
from charter.ledger.authority._seal import SealedGrant, grant_digest
from charter.ledger.events import Event
from charter.ledger.journal import Committed, Journal

__all__ = ["AgentRecord", "AuthorityView"]

_TYPES = (AgentRegistered.type_name, GrantMinted.type_name)


@dataclass(frozen=True)
class AgentRecord:
    """A durable agent: its name, lineage, trust root, and its ceiling grant."""

    name: str
    lineage: Lineage
    trust_root: bytes
    position: int
    ceiling: SealedGrant | None = None

    def to_json(self) -> dict[str, object]:
        terms = self.ceiling.grant.terms.canonical if self.ceiling else None
        return {
            "name": self.name,
            "lineage": str(self.lineage),
            "trust_root": self.trust_root.hex(),
            "position": self.position,
            "ceiling": terms,
        }


class AuthorityView:
    """Durable agents by name; journaled grant digests by lineage; children minted."""

    def __init__(self) -> None:
        self.agents: dict[str, AgentRecord] = {}
        self.digests: dict[Lineage, bytes] = {}
        self.minted: dict[Lineage, int] = {}
        self.position = 0

    def refresh(self, journal: Journal) -> None:
        """Fold every entry committed since the last refresh."""
        head = journal.head()
        if head is None or head[0] <= self.position:
            return
        for entry in journal.entries(start=self.position + 1, stop=head[0], types=_TYPES):
            self.apply(entry.event, entry.position)
        self.position = head[0]

    def applied(self, committed: Iterable[Committed]) -> None:
        """Fold our own commit; skip the re-read when nothing else was written between."""
        batch = list(committed)
        for c in batch:
            self.apply(c.event, c.position)
        if batch and batch[0].position == self.position + 1:
            self.position = batch[-1].position

    def apply(self, event: Event, position: int) -> None:
        if isinstance(event, AgentRegistered):
            if event.name not in self.agents:
                self.agents[event.name] = AgentRecord(
                    event.name, event.lineage, bytes.fromhex(event.trust_root), position
                )
        elif isinstance(event, GrantMinted):
            self.digests[event.lineage] = grant_digest(
                event.body.encode("utf-8"), bytes.fromhex(event.signature)
            )
            if event.lineage.is_root:
                record = self.agents.get(event.lineage.root_name)
                if record is not None and record.ceiling is None:
                    self.agents[record.name] = AgentRecord(
                        record.name,
                        record.lineage,
                        record.trust_root,
                        record.position,
                        event.sealed(),
                    )
            else:
                # Children are numbered sa-1, sa-2, … under their parent: the highest
                # number is how many it has minted (max keeps the fold idempotent).
                number = event.lineage.segments[-1].removeprefix("sa-")
                if number.isdigit():
                    self.minted[event.issuer] = max(self.minted.get(event.issuer, 0), int(number))
