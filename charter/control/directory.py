"""The directory of durable agents: registering one, and the view of the directory and
of what has been minted, folded from the journal.

The fold is idempotent (re-reading an entry changes nothing), so the view can apply its
own committed events at once and still re-read safely. It is only ever used together
with a pinned append: a decision taken on a stale view fails to commit.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from pydantic import ConfigDict, Field

from charter.authority import (
    MAX_FANOUT,
    AgentRegistered,
    Clearance,
    Grant,
    GrantMinted,
    GrantTerms,
    LineageRevoked,
    PermissionMode,
    SealedGrant,
    SecretName,
    Signer,
    ToolName,
)
from charter.authority.errors import AgentExistsError, UnknownAgentError
from charter.budgets import BudgetLedgerOpened
from charter.core import MAX_LINEAGE_DEPTH, Budget, CheckedModel, Event, KeyStore, Lineage, now_ms
from charter.core.budget import MAX_TTL_S
from charter.core.destination import Destination
from charter.core.framing import grant_digest
from charter.ledger import AppendConflictError, Journal, JournalFold

__all__ = [
    "DEFAULT_CEILING_TTL_S",
    "AgentRecord",
    "AuthorityView",
    "Ceiling",
    "custody_key_name",
    "register_root",
]

DEFAULT_CEILING_TTL_S = 365 * 86_400


def custody_key_name(name: str) -> str:
    """The key-store name of a durable agent's custody key."""
    return f"agent-{name}"


class Ceiling(CheckedModel):
    """A durable agent's ceiling grant, as an operator writes it (CLI options)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    budget: Budget
    clearance: Clearance = Clearance.INTERNAL
    mode: PermissionMode = PermissionMode.DEFAULT
    depth: int = Field(default=3, ge=0, le=MAX_LINEAGE_DEPTH)
    fanout: int = Field(default=1000, ge=0, le=MAX_FANOUT)
    tools: frozenset[ToolName] = frozenset()
    egress: frozenset[Destination] = frozenset()
    secrets: frozenset[SecretName] = frozenset()
    ttl_s: int = Field(default=DEFAULT_CEILING_TTL_S, ge=1, le=MAX_TTL_S)

    def terms(self, now_ms: int) -> GrantTerms:
        return GrantTerms(
            tools=self.tools,
            egress=self.egress,
            secrets=self.secrets,
            clearance=self.clearance,
            mode=self.mode,
            depth=self.depth,
            fanout=self.fanout,
            budget=self.budget,
            expires_at_ms=now_ms + self.ttl_s * 1000,
        )


_TYPES = (AgentRegistered.type_name, GrantMinted.type_name, LineageRevoked.type_name)


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
    """Durable agents by name; journaled grant digests by lineage; for each parent, the
    children minted and the fan-out allowance they hold (each child one, plus its own)."""

    types = _TYPES

    def __init__(self) -> None:
        super().__init__()
        self.agents: dict[str, AgentRecord] = {}
        self.digests: dict[Lineage, bytes] = {}
        self.minted: dict[Lineage, int] = {}
        self.reserved: dict[Lineage, int] = {}
        self._holds: dict[Lineage, int] = {}  # what each child holds of its parent's
        self.revoked: dict[Lineage, int] = {}  # revoked lineage -> position of the revoke

    def apply(self, event: Event, position: int, at_ms: int = 0) -> None:
        del at_ms
        if isinstance(event, LineageRevoked):
            self.revoked.setdefault(event.lineage, position)
        elif isinstance(event, AgentRegistered):
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
                if event.lineage not in self._holds:  # counted once per child
                    # The signed body's own fan-out (one small parse, not a validation:
                    # the chain is verified whenever this child acts).
                    allowance = int(orjson.loads(event.body)["terms"]["fanout"])
                    self._holds[event.lineage] = 1 + allowance
                    self.reserved[event.issuer] = self.reserved.get(event.issuer, 0) + 1 + allowance

    def revoked_above(self, lineage: Lineage) -> Lineage | None:
        """``lineage`` or its nearest ancestor that was revoked, if any."""
        if not self.revoked:
            return None
        for node in (lineage, *lineage.ancestors()):
            if node in self.revoked:
                return node
        return None

    def agent(self, name: str) -> AgentRecord:
        """The directory entry of ``name`` (as of the last refresh)."""
        record = self.agents.get(name)
        if record is None:
            raise UnknownAgentError(
                f"no durable agent {name!r} in the directory; see `charter agent list`"
            )
        return record

    def listing(self) -> list[AgentRecord]:
        """Every durable agent, in the order they were registered."""
        return sorted(self.agents.values(), key=lambda a: a.position)


def register_root(
    journal: Journal,
    keystore: KeyStore,
    name: str,
    ceiling: Ceiling,
    *,
    at_ms: int | None = None,
    budget_ledger: bool = True,
    declared: tuple[Event, ...] = (),
) -> AgentRecord:
    """Register durable agent ``name``: create its custody key in the Charter home and
        journal its directory entry (trust root), self-issued ceiling grant and budget ledger
        (the ceiling's budget), in one append. ``budget_ledger=False`` registers an agent
        that cannot spend or spawn (tests of the fail-closed path use it). ``declared`` gives
    more facts of the agent for the same append (an own-sandbox agent's declaration).

        Refuses if the name is taken. If the append fails, the new key file is removed.
    """
    lineage = Lineage.root(name)
    if journal.stream_version(str(lineage)):  # the append below pins the same stream
        raise AgentExistsError(f"agent {name!r} is already in the directory")
    key_name = custody_key_name(name)
    key = keystore.create(key_name)
    try:
        issued = now_ms() if at_ms is None else at_ms
        public = bytes(key.verify_key)
        grant = Grant(
            lineage=lineage,
            issuer=lineage,
            subject_key=public.hex(),
            parent_digest=None,
            issued_at_ms=issued,
            terms=ceiling.terms(issued),
        )
        sealed = Signer.from_key(key).seal(grant)
        events: tuple[Event, ...] = (
            AgentRegistered(name=name, lineage=lineage, trust_root=public.hex()),
            GrantMinted.of(f"register:{name}", sealed),
        )
        if budget_ledger:
            events += (BudgetLedgerOpened(lineage=str(lineage), allocation=ceiling.budget),)
        events += declared
        committed = journal.append(events, expect={str(lineage): 0})
    except AppendConflictError as e:
        keystore.remove(key_name)
        raise AgentExistsError(f"agent {name!r} was registered concurrently") from e
    except BaseException:
        keystore.remove(key_name)  # no custody key without its directory entry
        raise
    return AgentRecord(name, lineage, public, committed[0].position, sealed)
