"""The authority service: resolve the caller, decide, append once, then hand out grants.

This is the edge where effects live. The parent is resolved here from what the caller
*holds* (its chain of sealed grants and its custody key), never from the request. The
decision is :func:`decide`; its events go to the journal in one append pinned to the
parent's stream version, and grants are returned only after that append commits.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nacl.signing import SigningKey
from pydantic import BaseModel, ConfigDict, Field

from charter.ledger._follow import now_ms as wall_clock_ms
from charter.ledger.authority._axes import (
    Clearance,
    Destination,
    PermissionMode,
    SecretName,
    ToolName,
)
from charter.ledger.authority._decide import (
    AttenuateFn,
    FanoutCommand,
    FanoutDecision,
    MintedChild,
    ParentState,
    decide,
    refusal_event,
)
from charter.ledger.authority._events import AgentRegistered, GrantMinted
from charter.ledger.authority._gate import CostBenefitPolicy, GateDecision, GatePolicy
from charter.ledger.authority._grant import MAX_FANOUT, Grant, GrantTerms, attenuate
from charter.ledger.authority._intent import SpawnIntent
from charter.ledger.authority._lineage import MAX_LINEAGE_DEPTH, Lineage
from charter.ledger.authority._seal import SealedGrant, Signer, check_custody, verify_chain
from charter.ledger.authority._view import AgentRecord, AuthorityView
from charter.ledger.authority.errors import (
    AgentExistsError,
    AuthorityRefusedError,
    GrantChainBrokenError,
    GrantNotJournaledError,
    UnknownAgentError,
    UnknownParentError,
)
from charter.ledger.budget import Budget
from charter.ledger.errors import AppendFailedError, CharterError, RefusedError
from charter.ledger.events import Event
from charter.ledger.home import KeyStore
from charter.ledger.journal import AppendConflictError, Journal
from charter.ledger.leases import BudgetLedgerOpened

__all__ = [
    "Caller",
    "Ceiling",
    "SpawnResult",
    "AuthorityService",
    "Extension",
    "custody_key_name",
    "register_root",
]

_CONFLICT_RETRIES = 3
DEFAULT_CEILING_TTL_S = 365 * 86_400

# A later stage of a fan-out (budget leases, admission): it adds events to the same
# append, or turns the decision into a journaled refusal.
Extension = Callable[[FanoutDecision, SpawnIntent], FanoutDecision]


def custody_key_name(name: str) -> str:
    """The key-store name of a durable agent's custody key."""
    return f"agent-{name}"


class Ceiling(BaseModel):
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
    ttl_s: int = Field(default=DEFAULT_CEILING_TTL_S, ge=1)

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


@dataclass(frozen=True)
class Caller:
    """What a caller holds: its chain of sealed grants (root first) and its custody key.

    For a durable agent the chain is its ceiling grant alone; for a worker, the chain
    from its root down to its own grant (the key broker holds its key).
    """

    chain: tuple[SealedGrant, ...]
    custody_key: SigningKey

    @property
    def claimed(self) -> str:
        return str(self.chain[-1].grant.lineage) if self.chain else "unknown"

    def child(self, minted: MintedChild) -> Caller:
        """The caller a minted worker becomes (Python API; the key broker in production)."""
        return Caller((*self.chain, minted.sealed), minted.custody_key())


@dataclass(frozen=True)
class SpawnResult:
    """A committed fan-out: handed out only after its append committed."""

    fanout_id: str
    parent: Lineage
    gate: GateDecision
    children: tuple[MintedChild, ...]
    positions: tuple[int, int]

    def to_json(self) -> dict[str, object]:
        return {
            "fanout": self.fanout_id,
            "parent": str(self.parent),
            "gate": self.gate.model_dump(mode="json"),
            "positions": list(self.positions),
            "children": [str(c.lineage) for c in self.children],
        }


def register_root(
    journal: Journal,
    keystore: KeyStore,
    name: str,
    ceiling: Ceiling,
    *,
    now_ms: int | None = None,
    budget_ledger: bool = True,
) -> AgentRecord:
    """Register durable agent ``name``: create its custody key in the Charter home and
    journal its directory entry (trust root), self-issued ceiling grant and budget ledger
    (the ceiling's budget), in one append. ``budget_ledger=False`` registers an agent
    that cannot spend or spawn (tests of the fail-closed path use it).

    Refuses if the name is taken. If the append fails, the new key file is removed.
    """
    lineage = Lineage.root(name)
    if journal.stream_version(str(lineage)):  # the append below pins the same stream
        raise AgentExistsError(f"agent {name!r} is already in the directory")
    key_name = custody_key_name(name)
    key = keystore.create(key_name)
    try:
        now = wall_clock_ms() if now_ms is None else now_ms
        public = bytes(key.verify_key)
        grant = Grant(
            lineage=lineage,
            issuer=lineage,
            subject_key=public.hex(),
            parent_digest=None,
            issued_at_ms=now,
            terms=ceiling.terms(now),
        )
        sealed = Signer.from_key(key).seal(grant)
        events: tuple[Event, ...] = (
            AgentRegistered(name=name, lineage=lineage, trust_root=public.hex()),
            GrantMinted.of(f"register:{name}", sealed),
        )
        if budget_ledger:
            events += (BudgetLedgerOpened(lineage=str(lineage), allocation=ceiling.budget),)
        committed = journal.append(events, expect={str(lineage): 0})
    except AppendConflictError as e:
        keystore.remove(key_name)
        raise AgentExistsError(f"agent {name!r} was registered concurrently") from e
    except BaseException:
        keystore.remove(key_name)  # no custody key without its directory entry
        raise
    return AgentRecord(name, lineage, public, committed[0].position, sealed)


class AuthorityService:
    """Spawns on behalf of callers, against one journal."""

    def __init__(
        self,
        journal: Journal,
        *,
        policy: GatePolicy | None = None,
        keystore: KeyStore | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        attenuate_fn: AttenuateFn = attenuate,
        extensions: Sequence[Extension] | None = None,
    ) -> None:
        self.journal = journal
        self.policy: GatePolicy = policy or CostBenefitPolicy()
        self.keystore = keystore or KeyStore()
        self.clock = clock
        self.attenuate_fn = attenuate_fn
        if extensions is None:
            # Budget leases are not optional: without them a fan-out would hand out
            # authority with no budget behind it. Imported here: resources builds on us.
            from charter.ledger.resources import default_stages

            extensions = default_stages(journal, clock)
        self.extensions = tuple(extensions)
        self.view = AuthorityView()

    def agents(self) -> list[AgentRecord]:
        self.view.refresh(self.journal)
        return sorted(self.view.agents.values(), key=lambda a: a.position)

    def agent(self, name: str) -> AgentRecord:
        self.view.refresh(self.journal)
        record = self.view.agents.get(name)
        if record is None:
            raise UnknownAgentError(
                f"no durable agent {name!r} in the directory; see `charter agent list`"
            )
        return record

    def durable_caller(self, name: str) -> Caller:
        """A durable agent as caller: its ceiling grant and its custody key from the home.

        The key is checked against the directory's trust root before anything else;
        a mismatch is a journaled refusal.
        """
        record = self.agent(name)
        key = self.keystore.load(custody_key_name(name))
        if record.ceiling is None:
            raise UnknownAgentError(f"agent {name!r} has no ceiling grant in the journal")
        try:
            check_custody(bytes(key.verify_key), record.trust_root, who=str(record.lineage))
        except AuthorityRefusedError as error:
            self._journal_refusal(str(record.lineage), None, error)
            raise
        return Caller((record.ceiling,), key)

    def _journal_refusal(
        self,
        actor: str,
        intent: SpawnIntent | None,
        error: RefusedError,
        fanout_id: str | None = None,
    ) -> None:
        event = refusal_event(
            fanout_id or uuid.uuid4().hex,
            actor,
            error,
            width=intent.width if intent else 0,
            objective=intent.objective if intent else "",
        )
        self.journal.record_refusal(event, error)

    def _resolve(self, caller: Caller, now_ms: int) -> SealedGrant:
        """Check what the caller holds; return its journaled leaf grant."""
        if not caller.chain:
            raise GrantChainBrokenError("a caller must present its chain of grants")
        root = caller.chain[0].grant.lineage
        record = self.view.agents.get(root.root_name)
        if record is None or record.lineage != root:
            raise UnknownParentError(
                f"{root} is not a durable agent in the directory; register it with "
                "`charter agent add`"
            )
        leaf = caller.chain[-1]
        custody = bytes(caller.custody_key.verify_key)
        if len(caller.chain) == 1:
            check_custody(custody, record.trust_root, who=str(root))
        check_custody(custody, bytes.fromhex(leaf.grant.subject_key), who=str(leaf.grant.lineage))
        verify_chain(caller.chain, record.trust_root, now_ms=now_ms)
        journaled = self.view.digests.get(leaf.grant.lineage, b"")
        if not hmac.compare_digest(journaled, leaf.digest):
            raise GrantNotJournaledError(
                f"the grant presented for {leaf.grant.lineage} is not the one the journal "
                "committed; only journaled grants carry authority"
            )
        return leaf

    def spawn(self, caller: Caller, intent: SpawnIntent) -> SpawnResult:
        """One fan-out: resolve, decide (the gate once), append once, then hand out.

        Raises the named refusal (journaled) when refused, and AppendFailedError (no
        grant handed out) when the journal does not commit.
        """
        fanout_id = uuid.uuid4().hex
        claimed = caller.claimed
        for _ in range(_CONFLICT_RETRIES):
            now_ms = self.clock()
            # Version first, then the view: everything the version covers is in the view.
            version = self.journal.stream_version(claimed) if claimed != "unknown" else 0
            self.view.refresh(self.journal)
            try:
                leaf = self._resolve(caller, now_ms)
            except AuthorityRefusedError as error:
                self._journal_refusal(claimed, intent, error, fanout_id)
                raise
            state = ParentState(
                sealed=leaf,
                custody_seed=bytes(caller.custody_key),
                minted=self.view.minted.get(leaf.grant.lineage, 0),
                version=version,
            )
            decision = decide(
                state,
                FanoutCommand(fanout_id, intent, now_ms),
                policy=self.policy,
                attenuate_fn=self.attenuate_fn,
            )
            for extend in self.extensions:
                if decision.refusal is None:
                    decision = extend(decision, intent)
            try:
                committed = self.journal.append(decision.events, expect=decision.expect)
            except AppendConflictError:
                continue  # someone else spawned from this parent meanwhile: decide again
            except AppendFailedError as e:
                if decision.refusal is not None:
                    decision.refusal.add_note(f"(the refusal could not be journaled: {e})")
                    raise decision.refusal from e
                raise
            self.view.applied(committed)
            for stage in self.extensions:  # stages that keep a view fold the commit too
                on_commit = getattr(stage, "on_commit", None)
                if on_commit is not None:
                    on_commit(committed)
            if decision.refusal is not None:
                raise decision.refusal
            if decision.gate is None:  # decide always asks the gate before minting
                raise CharterError("internal: a fan-out was minted without a gate decision")
            return SpawnResult(
                fanout_id,
                decision.parent,
                decision.gate,
                decision.children,
                (committed[0].position, committed[-1].position),
            )
        raise AppendConflictError(
            f"{claimed} kept changing while this fan-out was decided "
            f"({_CONFLICT_RETRIES} tries); retry"
        )
