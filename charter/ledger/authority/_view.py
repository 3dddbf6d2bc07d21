"""The authority view: the directory and what has been minted, folded from the journal.

The fold is idempotent (re-reading an entry changes nothing), so the view can apply its
own committed events at once and still re-read safely. It is only ever used together
with a pinned append: a decision taken on a stale view fails to commit.
"""

from __future__ import annotations

from dataclasses import dataclass

from charter.ledger._follow import JournalFold
from charter.ledger.authority._events import AgentRegistered, GrantMinted
from charter.ledger.authority._lineage import Lineage
from charter.ledger.authority._seal import SealedGrant, grant_digest
from charter.ledger.events import Event

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


class AuthorityView(JournalFold):
    """Durable agents by name; journaled grant digests by lineage; children minted."""

    types = _TYPES

    def __init__(self) -> None:
        super().__init__()
        self.agents: dict[str, AgentRecord] = {}
        self.digests: dict[Lineage, bytes] = {}
        self.minted: dict[Lineage, int] = {}

    def apply(self, event: Event, position: int, at_ms: int = 0) -> None:
        del at_ms
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
