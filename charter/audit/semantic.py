"""Semantic audits: does the history obey Charter's own rules? Pure (no journal).

It folds ``(position, topic, state)`` rows in position order, reading each entry's
stored canonical JSON (``{"at": ISO time, "payload": {...}}``) directly, not through the
product's event classes, and keeps its own books. Budgets use THE lease formula
(:mod:`charter.budgets.formula`); grant chains are checked with
:func:`charter.authority.verify_grant_chain`. The checks, each a finding with the
position where the rule first breaks:

- ``entry-format``: every entry decodes (canonical JSON with its time and payload).
- ``commit-order``: commit times never decrease with position.
- ``conservation``: at every entry that can raise a live ledger's use (a lease grant, a
  usage, a renewal), own spend + Σ charge(child) ≤ allocation on every axis, for the
  ledger and every ancestor (a live child is charged its allocation, an ended one what
  its subtree spent, capped at it).
- ``usage-after-end``: no usage is charged to a lease that is released or expired, or
  whose ancestor's is, and none to a lineage without a ledger.
- ``grant-chain``: every minted grant's chain, from its root's ceiling down to it,
  verifies to the root's registered trust root, and no axis, clearance or mode rises
  along it (the issuer must hold a verified grant).
- ``gate``: every fan-out's gate is decided exactly once, with an allowing verdict, by
  the minting parent, before the first of its mints.
- ``sandbox-lease``: a worker's sandbox is leased while its lease is live and after its
  grant was minted; a sandbox starts only after it was leased.
- ``lifecycle``: every started sandbox ends (exited, quarantined or discarded) or is
  still live: its lease has not ended as of the audited position.
- ``revoked-subtree``: no grant is minted, and no sandbox leased, under a lineage whose
  lease was released or that was revoked (``LineageRevoked``), after that position.
- ``key-rotation``: every journal key rotation is signed by the journal's current key
  and by the new one (the journal's first key is its ``JournalCreated`` entry's).
- ``trust-anchor``: a root's registration (its trust root), its root grant and its
  budget ledger are write-once: a second one is a finding and the first one stays.
- ``lineage-reuse``: a lineage is minted once and leased once (a second lease would
  restart its spend).
- ``admission``: a slot is admitted only on a configured cell, never past the class's
  cap, and, while the class has a queue, only to the queue's head.
- ``worker-lifecycle``: a worker starts holding a verified grant, in a sandbox leased
  for it; a started worker ends, or its lease is still live at the audit's end.
- ``entry-type``: every entry is of a type (and version) this audit knows.
- ``journal-allowance``: at every position, the journal bytes each worker caused (its
  results, its waits, its children's schedules, each as the runner charges them) are at
  most :data:`JOURNAL_FLOOR` + the egress charged to it so far, and each worker's
  journal allowance is refused (``BudgetRefused``, operation ``journal``) at most once.
- ``cell-claim``: a cell's incarnations start in order (1, 2, …); a claim is renewed
  only by the cell's newest incarnation, before its claim lapses; a worker is started
  only by its cell's newest incarnation, before its claim lapses; a worker whose
  schedule asks a class (``cell_class``) is scheduled only on a cell whose newest
  ``CellStarted`` has that class.
- ``model-call``: at every reservation or block held, and at every fan-out carving
  leases out of a lease that holds blocks, the lease's own tokens charged and its
  children's charges, plus its calls reserved and not settled and its blocks held
  (each less its settled calls' charges; this one included) are at most its
  allocation of tokens, on a live lease; a call is reserved once (on its own, or drawn
  from a block it settles on while the block is held, within it) and settled at most
  once, after its reservation, for its lineage, in the same append as the
  ``UsageRecorded`` charging (or refusing) exactly its tokens (or after its lease's
  refusal, the lease having ended); an estimate is flagged so and within the
  reservation; a block is released once, and a recovered one charges exactly its
  unsettled remainder in its append.
- ``credential``: a held credential is injected only in a leased sandbox, a worker's
  only if its verified grant names the secret, only to a destination the sandbox's leased egress
  admits, committed with that dial's ``EgressOpened``; a sandbox that withheld a
  credential (a test run) injects none.
- ``quarantine``: a workspace is digested only on a quarantine verdict on that worker
  and sandbox, a sandbox leased for it; a digest made (not an error) precedes the
  sandbox's end; a live, unkilled worker's ``WorkerKilled`` is committed with its digest.

``RULES`` maps each rule the control plane enforces to the check that audits it
(docs/VERIFYING.md §9 has the same table; a test keeps the two equal).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from charter.audit._books import Books, Ledger
from charter.audit.errors import KeyRotationError
from charter.audit.keys import KeyHistory, journal_origin
from charter.authority import SealedGrant, verify_grant_chain
from charter.core.budget import Vec
from charter.core.destination import admits
from charter.core.errors import CharterError
from charter.core.events import canonical_json

__all__ = [
    "AuditReport",
    "Auditor",
    "Finding",
    "audit_history",
    "CHECKS",
    "JOURNAL_ENTRY_OVERHEAD",
    "JOURNAL_FLOOR",
    "JOURNAL_WAIT_ENTRIES",
    "KNOWN_TOPICS",
    "RULES",
]

CHECKS = (
    "entry-format",
    "commit-order",
    "conservation",
    "usage-after-end",
    "grant-chain",
    "gate",
    "sandbox-lease",
    "lifecycle",
    "revoked-subtree",
    "key-rotation",
    "trust-anchor",
    "lineage-reuse",
    "admission",
    "worker-lifecycle",
    "entry-type",
    "journal-allowance",
    "cell-claim",
    "model-call",
    "credential",
    "quarantine",
    "outward-call",
    "delegation",
)

# What the control plane enforces, and the check that audits it afterwards.
RULES: tuple[tuple[str, str], ...] = (
    ("an entry is one of Charter's types, at a version it writes", "entry-type"),
    ("entries decode and carry their type's fields", "entry-format"),
    ("commit times never decrease", "commit-order"),
    ("a root is registered once: its trust root is pinned", "trust-anchor"),
    ("a root's ceiling grant is minted once", "trust-anchor"),
    ("a root's budget ledger is opened once", "trust-anchor"),
    ("a lineage is minted once and leased once", "lineage-reuse"),
    ("a grant attenuates its issuer's verified grant, up to the trust root", "grant-chain"),
    ("a lease goes to a lineage holding its verified grant", "grant-chain"),
    ("a fan-out's gate is decided once, before its mints, by the issuer", "gate"),
    ("a fan-out mints no more children than its gate's width", "gate"),
    ("no mint or sandbox under a released subtree", "revoked-subtree"),
    ("leases never spend past their parent's allocation", "conservation"),
    ("no usage or lease out of an ended or missing ledger", "usage-after-end"),
    ("slots only on configured cells, never past the cap", "admission"),
    ("a class with a queue admits its head first", "admission"),
    ("a worker's sandbox is leased under its grant and live lease", "sandbox-lease"),
    ("an operator's sandbox names no lease, no grant, and runs no worker", "sandbox-lease"),
    ("a started sandbox ends (or its lease, or wall clock, still runs)", "lifecycle"),
    ("a worker starts under a verified grant, in its own sandbox", "worker-lifecycle"),
    ("a started worker ends (or its lease is still live)", "worker-lifecycle"),
    ("journal keys rotate only when both keys sign", "key-rotation"),
    ("a worker ends at most once", "worker-lifecycle"),
    ("a cell's incarnations start in order, each fencing the one before", "cell-claim"),
    ("a claim is renewed by the newest incarnation, before it lapses", "cell-claim"),
    ("a worker is started by its cell's newest incarnation, before its claim lapses", "cell-claim"),
    ("a worker asking a class is placed on a cell started with that class", "cell-claim"),
    ("a worker's journal bytes stay within its floor and the egress charged", "journal-allowance"),
    ("a worker's journal allowance is refused (journaled) at most once", "journal-allowance"),
    ("no commit is timed before a settle (settled time)", "commit-order"),
    ("a model call is reserved within its lease's tokens, net of calls in flight", "model-call"),
    ("a model call is settled once, after its reservation", "model-call"),
    ("a model call's settlement charges its tokens in the same append", "model-call"),
    ("a block of tokens is held within its lease's tokens, net of what is held", "model-call"),
    ("a fan-out carves no tokens its parent's blocks hold", "model-call"),
    ("a block is released once, a recovered one charging its unsettled remainder", "model-call"),
    ("a held credential is injected only for a secret the sandbox's grant names", "credential"),
    ("a held credential goes only to a destination the sandbox's egress admits", "credential"),
    ("a held credential is injected with its dial's EgressOpened", "credential"),
    ("a test run's sandbox withholds every held credential", "credential"),
    ("a workspace is digested only on a quarantine verdict, before its sandbox ends", "quarantine"),
    ("a quarantined worker's kill is committed with its workspace digest", "quarantine"),
    ("an outward call's intent is journaled once per lease and key", "outward-call"),
    ("an outward call's outcome follows its intent, once", "outward-call"),
    ("a delegation is journaled before its reservation, out of its caller's lease", "delegation"),
    ("a delegate never delegates: delegation is one level deep", "delegation"),
    ("a delegation's reply follows its request and its start, once", "delegation"),
)

# Every topic Charter writes (``TypeName/vN``); any other is an ``entry-type`` finding.
# tests/audit/test_rules.py keeps this equal to the catalogue's.
KNOWN_TOPICS = frozenset(
    f"{name}/v1"
    for name in (
        "AdmissionRefused",
        "AgentRegistered",
        "BaselineChanged",
        "BudgetLedgerOpened",
        "BudgetRefused",
        "BudgetSettled",
        "CanariesPlanted",
        "CeilingCheckFailedOpen",
        "CellClaimRenewed",
        "CellConfigured",
        "CellStarted",
        "CredentialInjected",
        "CredentialWithheld",
        "EgressAttempted",
        "EgressOpened",
        "GateDecided",
        "GrantMinted",
        "JournalCreated",
        "JournalKeyRotated",
        "KillVerdict",
        "LeaseGranted",
        "LeaseReleased",
        "LeaseRenewed",
        "LineageRevoked",
        "ModelCallRefused",
        "ModelCallReserved",
        "ModelCallSettled",
        "ModelTokensHeld",
        "ModelTokensReleased",
        "OutwardIntent",
        "OutwardOutcome",
        "OwnSandboxDeclared",
        "DelegationRequested",
        "DelegationRefused",
        "DelegationReplied",
        "PauseVerdict",
        "PopulationGrew",
        "QuarantineVerdict",
        "ResumeVerdict",
        "SandboxDiscarded",
        "SandboxExited",
        "SandboxLeased",
        "SandboxProbeRefused",
        "SandboxQuarantined",
        "SandboxStarted",
        "SlotAdmitted",
        "SlotQueued",
        "SlotReleased",
        "SpawnRefused",
        "ThrottleVerdict",
        "UsageRecorded",
        "WorkerEnded",
        "WorkerKilled",
        "WorkerProfiled",
        "WorkerResult",
        "WorkerSampled",
        "WorkerScheduled",
        "WorkerStarted",
        "WorkerWaiting",
        "WorkspaceDigested",
        "WorkspaceRefused",
    )
)
# The runner's journal allowance (charter/runner/_journal_allowance.py, decision 0012),
# restated: the audit imports no runner. tests/audit/test_rules_cells.py keeps them
# equal to the runner's.
JOURNAL_FLOOR = 128 * 1024  # journal bytes each worker may cause without charge
JOURNAL_ENTRY_OVERHEAD = 384  # charged per entry a request journals, beyond its payload
JOURNAL_WAIT_ENTRIES = 6  # the entries one wait journals

_AXES = ("tokens", "wall_ms", "cpu_ms", "mem_bytes", "egress_bytes")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ALLOWING = ("positive", "neutral")
_ENDS = ("SandboxExited", "SandboxQuarantined", "SandboxDiscarded")
_loads = orjson.loads
_USAGE = "UsageRecorded/v1"
# The usage's topic goes straight to its rule, outside the topic table: another version
# of it known here would reach no rule, so it may not be known without one.
if {t for t in KNOWN_TOPICS if t.startswith("UsageRecorded/")} != {_USAGE}:
    raise RuntimeError(f"the audit's usage rule reads {_USAGE} only")


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    check: str
    position: int
    lineage: str | None
    detail: str


class AuditReport(BaseModel):
    """The ``--json`` document of ``charter audit``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    checked: int
    findings: tuple[Finding, ...]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


_axes_of = operator.itemgetter(*_AXES)


def _vec(d: dict[str, Any]) -> Vec:
    """A budget's five axes, each through ``int`` (the hot path: the axes are read in
    one call, and ints, what the product writes, are taken as they are)."""
    v: Vec = _axes_of(d)
    a, b, c, e, f = v
    if type(a) is int and type(b) is int and type(c) is int and type(e) is int and type(f) is int:
        return v
    return (int(a), int(b), int(c), int(e), int(f))


def _ms(text: str) -> int:
    return (datetime.fromisoformat(text) - _EPOCH) // timedelta(milliseconds=1)


def _host_port(destination: str) -> tuple[str, int | None]:
    """``host:port`` (``[v6]:port``) as the broker records a dial (port None: unparsed)."""
    host, _, port = destination.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port) if port.isdecimal() else None


def _parent(lineage: str) -> str | None:
    return lineage.rpartition("/")[0] if "/" in lineage else None


@dataclass
class _Sandbox:
    position: int
    lineage: str | None
    lease: str | None
    started: int | None = None
    ended: bool = False
    wall_ms: int = 0
    started_at: int = 0
    egress: tuple[str, ...] = ()
    withheld: int | None = None  # position of its first withheld credential
    injected: int | None = None  # position of its first injected credential


@dataclass
class _Cell:
    """A cell's slots as the audit folds them (``caps`` empty until it is configured)."""

    caps: dict[str, int]
    holders: dict[str, set[str]]
    queued: dict[str, dict[str, None]]  # per class, in arrival order


@dataclass
class _Worker:
    position: int
    ended: bool = False


@dataclass
class _Delegation:
    caller: str
    replied: bool = False


@dataclass
class _Claim:
    """A cell's newest incarnation and when its claim lapses (None: no bound, a
    ``CellStarted`` written before claims existed)."""

    incarnation: int
    until: int | None
    classes: frozenset[str] = frozenset()  # the classes it started with


@dataclass
class _Call:
    """A model call's reservation, until it is settled."""

    lineage: str
    reserved: int
    prompt_estimate: int
    max_tokens: int


@dataclass
class _Block:
    """A block of a lease's tokens held for its model calls, until it is released."""

    lineage: str
    tokens: int
    charged: int = 0

    @property
    def holding(self) -> int:
        return max(self.tokens - self.charged, 0)


@dataclass
class _Allowance:
    """The journal bytes a worker caused, and its refusal."""

    worker: bool = False  # scheduled: only a worker's allowance is bounded
    caused: int = 0
    refused: int | None = None  # position of its journaled refusal


def _usage_refused(kind: str, q: dict[str, Any], lineage: str) -> bool:
    """Whether the entry is ``lineage``'s refusal of a usage (its lease ended: a model
    call's settlement is then journaled alone); a refusal of a spawn or a release is not."""
    return kind == "BudgetRefused" and q.get("lineage") == lineage and q.get("operation") == "usage"


class _Auditor:
    def __init__(self, on_finding: Callable[[Finding], None] | None = None) -> None:
        self.findings: list[Finding] = []
        self._on_finding = on_finding
        self.books = Books()
        self._ledgers = self.books.ledgers  # the hot path's look-up
        self.trust_roots: dict[str, bytes] = {}
        self.chains: dict[str, tuple[SealedGrant, ...]] = {}
        # fanout → (position, actor, verdict, width)
        self.gates: dict[str, tuple[int, str, str, int]] = {}
        self.minted_fanouts: set[str] = set()
        self.released: dict[str, int] = {}  # lineage → position of its release
        self.sandboxes: dict[str, _Sandbox] = {}
        self.keys: KeyHistory | None = None
        self.registered: dict[str, int] = {}  # root → position of its registration
        self.opened: dict[str, int] = {}  # root → position of its budget ledger
        self.minted: dict[str, int] = {}  # lineage → position of its first mint
        self.fanout_mints: dict[str, int] = {}  # fanout → children minted in it
        self.cells: dict[str, _Cell] = {}
        self.workers: dict[str, _Worker] = {}
        self.ended_workers: dict[str, int] = {}  # lineage → position of its end
        self.claims: dict[str, _Claim] = {}  # cell → its newest incarnation's claim
        self.allowances: dict[str, _Allowance] = {}
        self.egress: dict[str, int] = {}  # lineage → egress charged to it (usage)
        self.calls: dict[str, _Call] = {}  # model calls reserved and not settled
        self.called: set[str] = set()  # every model call reserved
        self.in_flight: dict[str, int] = {}  # lineage → tokens reserved, not settled
        self.blocks: dict[str, _Block] = {}  # model blocks held, not released
        self.blocks_seen: set[str] = set()
        self._run: list[Any] | None = None  # the settlements after a UsageRecorded
        self.digested: dict[str, int] = {}  # lineage → position of its quarantine digest
        self.quarantines: set[tuple[str, str]] = set()  # (lineage, sandbox) verdicts
        self.killed: set[str] = set()  # lineages with a WorkerKilled
        # (lineage, key) of each outward intent → whether its outcome was journaled
        self.outward: dict[tuple[str, str], bool] = {}
        self.delegations: dict[str, _Delegation] = {}  # by delegate
        # (lineage, its digest's commit time, its position): the next entry kills it
        self._must_kill: tuple[str, object, int] | None = None
        self._prev: tuple[str, dict[str, Any], object] = ("", {}, None)
        handlers = self._make_handlers()
        # topic → (its type, the handler of the rules that read it, or None)
        self._dispatch: dict[str, tuple[str, Callable[[dict[str, Any], int], None] | None]] = {
            topic: (kind, handlers.get(kind))
            for topic in KNOWN_TOPICS
            for kind in (topic.partition("/")[0],)
        }
        self.last_at = 0
        self.position = 0
        self.checked = 0
        self._at_text: object = None
        self._at_ms = 0

    def find(self, check: str, lineage: str | None, detail: str) -> None:
        self.report(Finding(check=check, position=self.position, lineage=lineage, detail=detail))

    def report(self, finding: Finding) -> None:
        self.findings.append(finding)
        if self._on_finding is not None:
            self._on_finding(finding)

    # -- budgets -----------------------------------------------------------------------

    def _check_conserved(self, lineage: str, t: int) -> None:
        node = self.books.get(lineage)
        if node is not None:
            self._check_path(node.path, t)

    def _check_path(self, path: tuple[Ledger, ...], t: int) -> None:
        """Each live ledger of ``path`` (a ledger and its ancestors) within its
        allocation on every axis."""
        self.books.check(tuple(node for node in path if node.live(t)), t, self._over)

    def _over(self, node: Ledger, t: int) -> None:
        u, cap = self.books.used(node, t), node.allocation
        over = [a for a, x, c in zip(_AXES, u, cap, strict=True) if x > c]
        self.find(
            "conservation",
            node.lineage,
            f"{node.lineage} uses {dict(zip(_AXES, u, strict=True))} of its "
            f"allocation {dict(zip(_AXES, cap, strict=True))} ({', '.join(over)})",
        )

    def ledger_opened(self, p: dict[str, Any]) -> None:
        lineage = str(p["lineage"])
        if self.books.get(lineage) is not None:
            first = self.opened.get(lineage)
            self.find(
                "trust-anchor",
                lineage,
                f"a second budget ledger for {lineage} (its first at position {first}); "
                "the first stays",
            )
            return
        if lineage not in self.registered:
            self.find(
                "trust-anchor",
                lineage,
                f"a budget ledger for {lineage}, which is not a registered root",
            )
        self.opened[lineage] = self.position
        self.books.open_root(lineage, _vec(p["allocation"]))

    def lease_granted(self, p: dict[str, Any], t: int) -> None:
        parent = str(p["parent"])
        ledger = self.books.get(parent)
        if ledger is None or not ledger.live(t):
            self.find(
                "usage-after-end",
                parent,
                f"leases granted out of {parent}, which holds no live ledger",
            )
            if ledger is None:
                return
        self._leased_grants(p)
        if self.delegations:
            self._delegate_leased([str(x) for x in p["lineages"]], parent)
        fresh: list[str] = []
        for lineage in (str(lineage) for lineage in p["lineages"]):
            if self.books.get(lineage) is not None or lineage in fresh:
                self.find(
                    "lineage-reuse",
                    lineage,
                    f"{lineage} leased again; its first lease (and its spend) stays",
                )
            else:
                fresh.append(lineage)
        if not fresh:
            return
        allocation, expires = _vec(p["allocation"]), int(p["expires_at_ms"])
        self.books.grant(ledger, tuple(fresh), allocation, expires)
        self._check_conserved(parent, t)
        if ledger.live(t):
            self._holds_fit(f"leases of {len(fresh)} children", ledger, t)

    def _leased_grants(self, p: dict[str, Any]) -> None:
        """Each leased lineage holds a verified grant, the one the lease names if any."""
        lineages = [str(lineage) for lineage in p["lineages"]]
        digests: list[str | None] = [str(d) for d in p.get("grants") or ()]
        digests = digests or [None] * len(lineages)
        for lineage, named in zip(lineages, digests, strict=False):
            chain = self.chains.get(lineage)
            if chain is None:
                self.find("grant-chain", lineage, f"leased to {lineage}, which holds no grant")
            elif named is not None and chain[-1].digest.hex() != named:
                self.find(
                    "grant-chain",
                    lineage,
                    f"the lease of {lineage} names grant {named[:16]}…, not its minted one",
                )

    def usage(self, lineage: str, amount: dict[str, Any], ledger: Ledger | None, t: int) -> None:
        """A usage whose ledger is missing or not calm (``Books.calm``; a calm one is
        charged by :meth:`apply_rows` itself): where its whole chain is live, the books
        charged and the chain checked in one pass (``Books.use`` with ``over``)."""
        if ledger is None:
            self.find(
                "usage-after-end", lineage, f"usage charged to {lineage}, which has no ledger"
            )
            return
        path = ledger.path
        for node in path:  # Ledger.live, inlined
            released, expires = node.released, node.expires
            if (released is not None and released <= t) or (expires is not None and t >= expires):
                self.find(
                    "usage-after-end",
                    lineage,
                    f"usage charged to {lineage} after {node.lineage}'s lease ended",
                )
                self.books.use(ledger, _vec(amount))
                self._check_path(path, t)
                return
        self.books.use(ledger, _vec(amount), t, self._over)

    def released_lease(self, p: dict[str, Any], t: int) -> None:
        lineage = str(p["lineage"])
        self.released.setdefault(lineage, self.position)
        ledger = self.books.get(lineage)
        if ledger is not None:
            self.books.release(ledger, t)

    def revoked(self, p: dict[str, Any]) -> None:
        """A revocation closes its subtree to mints and sandboxes, as a release does."""
        self.released.setdefault(str(p["lineage"]), self.position)

    def renewed(self, p: dict[str, Any], t: int) -> None:
        ledger = self.books.get(str(p["lineage"]))
        if ledger is None:
            self.find(
                "usage-after-end", str(p["lineage"]), "a renewal of a lease that does not exist"
            )
            return
        self.books.renew(ledger, int(p["expires_at_ms"]), t)
        self._check_conserved(str(p["parent"]), t)

    # -- authority -------------------------------------------------------------------

    def revoked_above(self, lineage: str) -> str | None:
        node: str | None = lineage
        while node is not None:
            if node in self.released:
                return node
            node = _parent(node)
        return None

    def grant_minted(self, p: dict[str, Any]) -> None:
        lineage, issuer, fanout = str(p["lineage"]), str(p["issuer"]), str(p["fanout"])
        revoked = self.revoked_above(issuer)
        if revoked is not None:
            self.find(
                "revoked-subtree",
                lineage,
                f"minted under {revoked}, released at position {self.released[revoked]}",
            )
        if lineage != issuer:
            self._gate_for_mint(fanout, issuer, lineage)
        first = self.minted.setdefault(lineage, self.position)
        if first != self.position:
            if lineage == issuer:
                self.find(
                    "trust-anchor",
                    lineage,
                    f"a second root grant for {lineage} (its first at position {first}); "
                    "the first stays",
                )
                return
            self.find(
                "lineage-reuse",
                lineage,
                f"{lineage} minted again (first at position {first}); the first stays",
            )
        try:
            sealed = SealedGrant.from_record({"body": p["body"], "signature": p["signature"]})
        except (CharterError, ValidationError, ValueError, KeyError, TypeError) as e:
            self.find("grant-chain", lineage, f"the minted grant does not parse: {e}")
            return
        if lineage == issuer:
            chain: tuple[SealedGrant, ...] = (sealed,)
        elif issuer in self.chains:
            chain = (*self.chains[issuer], sealed)
        else:
            self.find("grant-chain", lineage, f"its issuer {issuer} holds no verified grant")
            return
        root = str(chain[0].grant.lineage)
        trust_root = self.trust_roots.get(root)
        if trust_root is None:
            self.find("grant-chain", lineage, f"its root {root} is not registered")
            return
        try:
            verify_grant_chain(chain, trust_root)
        except CharterError as e:
            self.find("grant-chain", lineage, str(e))
            return
        self.chains.setdefault(lineage, chain)

    def gate_decided(self, p: dict[str, Any]) -> None:
        fanout = str(p["fanout"])
        if fanout in self.gates:
            self.find(
                "gate",
                str(p["actor"]),
                f"fan-out {fanout}'s gate decided again (first at {self.gates[fanout][0]})",
            )
            return
        if fanout in self.minted_fanouts:
            self.find("gate", str(p["actor"]), f"fan-out {fanout}'s gate decided after its mints")
        self.gates[fanout] = (self.position, str(p["actor"]), str(p["verdict"]), int(p["width"]))

    def _gate_for_mint(self, fanout: str, issuer: str, lineage: str) -> None:
        first = fanout not in self.minted_fanouts
        self.minted_fanouts.add(fanout)
        count = self.fanout_mints[fanout] = self.fanout_mints.get(fanout, 0) + 1
        gate = self.gates.get(fanout)
        if gate is None:
            if first:
                self.find(
                    "gate",
                    lineage,
                    f"minted in fan-out {fanout}, whose gate was never decided before it",
                )
            return
        _, actor, verdict, width = gate
        if count > width:
            self.find(
                "gate",
                lineage,
                f"child {count} minted in fan-out {fanout}, whose gate allowed {width}",
            )
        if first and verdict not in _ALLOWING:
            self.find("gate", lineage, f"minted in fan-out {fanout}, whose gate said {verdict}")
        if first and actor != issuer:
            self.find(
                "gate",
                lineage,
                f"fan-out {fanout}'s gate was asked by {actor}, not by the minting {issuer}",
            )

    def key_rotated(self, p: dict[str, Any]) -> None:
        if self.keys is None:
            self.find("key-rotation", None, "a key rotation in a journal with no first key")
            return
        try:
            self.keys = self.keys.rotated(self.position, p)
        except KeyRotationError as e:
            self.find("key-rotation", None, str(e))

    # -- sandboxes -------------------------------------------------------------------

    def sandbox_leased(self, p: dict[str, Any], t: int) -> None:
        sandbox = str(p["sandbox_id"])
        lineage = p.get("lineage")
        lease = p.get("lease") or lineage
        self.sandboxes[sandbox] = _Sandbox(
            self.position,
            lineage,
            lease,
            wall_ms=int(p.get("wall_ms") or 0),
            egress=tuple(str(e) for e in p.get("egress") or ()),
        )
        if lineage is None:
            # An operator's own sandbox (`charter sandbox run`): exempt from the grant
            # and lease checks only as long as it claims neither and runs no worker
            # (worker_started), and ends within its wall clock (lifecycle).
            if p.get("lease") is not None or p.get("grant_digest") is not None:
                self.find(
                    "sandbox-lease",
                    None,
                    f"operator sandbox {sandbox} names a lease or a grant but no lineage",
                )
            return
        digest = p.get("grant_digest")
        chain = self.chains.get(str(lineage))
        if digest is not None and chain is not None and chain[-1].digest.hex() != digest:
            self.find(
                "sandbox-lease",
                str(lineage),
                f"sandbox {sandbox} names grant {str(digest)[:16]}…, not {lineage}'s",
            )
        if str(lineage) not in self.chains:
            self.find(
                "sandbox-lease",
                str(lineage),
                f"sandbox {sandbox} leased for {lineage}, which holds no minted grant",
            )
        ledger = self.books.get(str(lease))
        if ledger is None or not ledger.live(t):
            self.find(
                "sandbox-lease",
                str(lineage),
                f"sandbox {sandbox} leased without a live lease ({lease})",
            )
        revoked = self.revoked_above(str(lineage))
        if revoked is not None:
            self.find(
                "revoked-subtree",
                str(lineage),
                f"sandbox {sandbox} leased under {revoked}, released at position "
                f"{self.released[revoked]}",
            )

    def sandbox_started(self, p: dict[str, Any], t: int) -> None:
        sandbox = self.sandboxes.get(str(p["sandbox_id"]))
        if sandbox is None:
            self.find(
                "sandbox-lease", None, f"sandbox {p['sandbox_id']} started without being leased"
            )
            self.sandboxes[str(p["sandbox_id"])] = _Sandbox(  # reported: not followed
                self.position, None, None, self.position, ended=True
            )
            return
        sandbox.started = self.position
        sandbox.started_at = t

    def sandbox_ended(self, p: dict[str, Any]) -> None:
        sandbox = self.sandboxes.get(str(p["sandbox_id"]))
        if sandbox is not None:
            sandbox.ended = True

    def lifecycle(self, t: int) -> None:
        for sandbox_id, s in self.sandboxes.items():
            if s.started is None or s.ended:
                continue
            if s.lease is None:
                if s.lineage is None and t > s.started_at + s.wall_ms:
                    self.report(
                        Finding(
                            check="lifecycle",
                            position=s.started,
                            lineage=None,
                            detail=f"operator sandbox {sandbox_id} started, its wall clock "
                            f"({s.wall_ms} ms) ran out, and it never exited or failed",
                        )
                    )
                continue
            ledger = self.books.get(s.lease)
            if ledger is None or not ledger.live(t):
                self.report(
                    Finding(
                        check="lifecycle",
                        position=s.started,
                        lineage=s.lineage,
                        detail=f"sandbox {sandbox_id} started, its lease ended, and it never "
                        "exited or failed",
                    )
                )

        for lineage, w in self.workers.items():
            if w.ended:
                continue
            ledger = self.books.get(lineage)
            if ledger is None or not ledger.live(t):
                self.report(
                    Finding(
                        check="worker-lifecycle",
                        position=w.position,
                        lineage=lineage,
                        detail=f"worker {lineage} started, its lease ended, and it never ended",
                    )
                )

    # -- workers -----------------------------------------------------------------------

    def worker_started(self, p: dict[str, Any], t: int) -> None:
        lineage = str(p["lineage"])
        self._claim_holds(str(p["cell"]), int(p["incarnation"]), t, lineage, f"started {lineage}")
        if lineage in self.workers:
            self.find("worker-lifecycle", lineage, f"worker {lineage} started again")
            return
        self.workers[lineage] = _Worker(self.position)
        self._delegate_started(lineage)
        if lineage not in self.chains:
            self.find(
                "worker-lifecycle", lineage, f"worker {lineage} started without a verified grant"
            )
        sandbox_id = p.get("sandbox_id")
        if sandbox_id is None:
            return
        sandbox = self.sandboxes.get(str(sandbox_id))
        if sandbox is None or sandbox.lineage != lineage:
            owner = "nobody" if sandbox is None else (sandbox.lineage or "the operator")
            self.find(
                "worker-lifecycle",
                lineage,
                f"worker {lineage} started in sandbox {sandbox_id}, leased for {owner}",
            )

    def worker_ended(self, p: dict[str, Any], _: int) -> None:
        lineage = str(p["lineage"])
        first = self.ended_workers.setdefault(lineage, self.position)
        if first != self.position:
            self.find(
                "worker-lifecycle",
                lineage,
                f"worker {lineage} ended again (first at position {first})",
            )
        worker = self.workers.get(lineage)
        if worker is not None:
            worker.ended = True

    # -- cell claims (fencing) ---------------------------------------------------------

    def cell_started(self, p: dict[str, Any], _: int) -> None:
        cell, incarnation = str(p["cell"]), int(p["incarnation"])
        until = p.get("claim_until_ms")
        listed = p.get("classes") or []
        if not isinstance(listed, list):
            raise TypeError(f"a CellStarted's classes are a list, not {type(listed).__name__}")
        last = self.claims.get(cell)
        expected = 1 if last is None else last.incarnation + 1
        if incarnation != expected:
            self.find(
                "cell-claim",
                None,
                f"cell {cell} started as incarnation {incarnation}, not {expected}",
            )
        # It moved the cell's run stream either way: it fences every earlier one.
        classes = frozenset(str(k) for k in listed)
        self.claims[cell] = _Claim(incarnation, None if until is None else int(until), classes)

    def cell_claim_renewed(self, p: dict[str, Any], t: int) -> None:
        cell, incarnation = str(p["cell"]), int(p["incarnation"])
        if self._claim_holds(cell, incarnation, t, None, "renewed its claim"):
            self.claims[cell].until = int(p["until_ms"])

    def _claim_holds(
        self, cell: str, incarnation: int, t: int, lineage: str | None, what: str
    ) -> bool:
        """Whether ``incarnation`` is ``cell``'s newest and its claim holds at ``t`` (a
        ``cell-claim`` finding if not)."""
        claim = self.claims.get(cell)
        who = f"cell {cell}'s incarnation {incarnation}"
        if claim is None or incarnation > claim.incarnation:
            self.find("cell-claim", lineage, f"{who} {what}, but it never started")
            return False
        if incarnation < claim.incarnation:
            self.find(
                "cell-claim",
                lineage,
                f"{who} {what} after incarnation {claim.incarnation} fenced it",
            )
            return False
        if claim.until is not None and t >= claim.until:
            self.find(
                "cell-claim",
                lineage,
                f"{who} {what} at {t} ms, after its claim lapsed ({claim.until} ms)",
            )
            return False
        return True

    def _placed_by_class(self, lineage: str, cell: str, asked: str) -> None:
        """A worker asking class ``asked`` is scheduled on a cell whose newest
        incarnation started with it (a ``cell-claim`` finding if not)."""
        claim = self.claims.get(cell)
        if claim is None:
            self.find(
                "cell-claim",
                lineage,
                f"{lineage} asks class {asked!r} but is placed on cell {cell}, which never started",
            )
        elif asked not in claim.classes:
            has = ", ".join(sorted(claim.classes)) or "none"
            self.find(
                "cell-claim",
                lineage,
                f"{lineage} asks class {asked!r} but is placed on cell {cell}, whose "
                f"incarnation {claim.incarnation} has classes: {has}",
            )

    # -- the journal allowance ---------------------------------------------------------

    def _allowance(self, lineage: str) -> _Allowance:
        allowance = self.allowances.get(lineage)
        if allowance is None:
            allowance = self.allowances[lineage] = _Allowance()
        return allowance

    def _caused(self, lineage: str, nbytes: int) -> None:
        a = self._allowance(lineage)
        a.caused += nbytes
        egress = self.egress.get(lineage, 0)
        bound = JOURNAL_FLOOR + egress
        if a.worker and a.caused > bound:
            self.find(
                "journal-allowance",
                lineage,
                f"{lineage} caused {a.caused} journal bytes, over its {JOURNAL_FLOOR}-byte "
                f"floor and the {egress} bytes of egress charged to it",
            )

    def worker_scheduled(self, p: dict[str, Any], _: int) -> None:
        lineage = str(p["lineage"])
        self._allowance(lineage).worker = True
        asked = p.get("cell_class")
        if asked is not None:
            self._placed_by_class(lineage, str(p["cell"]), str(asked))
        parent = _parent(lineage)
        if parent is not None:  # the worker-chosen bytes of the child's schedule
            self._caused(parent, len(canonical_json([list(p["argv"]), list(p["inputs"])])))

    def worker_result(self, p: dict[str, Any], _: int) -> None:
        self._caused(str(p["lineage"]), len(canonical_json(p)) + JOURNAL_ENTRY_OVERHEAD)

    def worker_waiting(self, p: dict[str, Any], _: int) -> None:
        overhead = JOURNAL_WAIT_ENTRIES * JOURNAL_ENTRY_OVERHEAD
        self._caused(str(p["lineage"]), len(canonical_json(p)) + overhead)

    def budget_refused(self, p: dict[str, Any], _: int) -> None:
        if p.get("operation") != "journal":
            return
        lineage = str(p["lineage"])
        a = self._allowance(lineage)
        if a.refused is not None:
            self.find(
                "journal-allowance",
                lineage,
                f"{lineage}'s journal allowance refused again (first at {a.refused})",
            )
            return
        a.refused = self.position

    # -- the model door ----------------------------------------------------------------

    def _held_over(self, what: str, lineage: str, t: int) -> None:
        """At a reservation or a hold: the lease is live and covers what it holds."""
        ledger = self.books.get(lineage)
        if ledger is None or not ledger.live(t):
            self.find("model-call", lineage, f"{what} without a live lease")
            return
        self._holds_fit(what, ledger, t)

    def _holds_fit(self, what: str, ledger: Ledger, t: int) -> None:
        """``ledger``'s tokens used (its own spend and its children's charges) and held
        (its calls reserved and its blocks, each less its settled calls' charges) fit
        its allocation: checked at a hold, and at a fan-out carving out of it."""
        lineage = ledger.lineage
        held = self.in_flight.get(lineage, 0) + sum(
            b.holding for b in self.blocks.values() if b.lineage == lineage
        )
        used, allocation = self.books.used(ledger, t)[0], ledger.allocation[0]
        if held and used + held > allocation:
            self.find(
                "model-call",
                lineage,
                f"{what}: {lineage} holds {used} charged or leased out and {held} "
                f"reserved, over its allocation of {allocation}",
            )

    def _first(self, seen: set[str], key: str, lineage: str, what: str) -> bool:
        """Whether ``key`` is new to ``seen`` (added); a finding (``what`` again) if not."""
        if key in seen:
            self.find("model-call", lineage, f"{what} again")
            return False
        seen.add(key)
        return True

    def model_tokens_held(self, p: dict[str, Any], t: int) -> None:
        block, lineage, tokens = str(p["block"]), str(p["lineage"]), int(p["tokens"])
        if not self._first(self.blocks_seen, block, lineage, f"model block {block} held"):
            return
        self.blocks[block] = _Block(lineage, tokens)
        self._held_over(f"model block {block} held {tokens} tokens", lineage, t)

    def model_tokens_released(self, p: dict[str, Any], _: int) -> None:
        block, lineage, charged = str(p["block"]), str(p["lineage"]), int(p["charged"])
        held = self.blocks.pop(block, None)
        if held is None or held.lineage != lineage:
            again = "again" if block in self.blocks_seen else "never held"
            self.find("model-call", lineage, f"model block {block} released {again}")
            return
        if p["recovered"] and charged != held.holding:
            self.find(
                "model-call",
                lineage,
                f"model block {block} recovered charging {charged}, not its unsettled "
                f"remainder {held.holding}",
            )
        if charged and not self._charged_in_append(lineage, charged):
            self.find(
                "model-call",
                lineage,
                f"model block {block}'s release does not charge its {charged} tokens in its append",
            )

    def _charged_in_append(self, lineage: str, tokens: int) -> bool:
        """The entry before this one, in its append, charges (or refuses) ``tokens`` to
        ``lineage``, or is its lease's refusal (the lease having ended)."""
        kind, q, at = self._prev
        charged = (
            kind == "UsageRecorded"
            and at == self._at_text
            and q.get("lineage") == lineage
            and int(q["amount"]["tokens"]) + int(q["refused"]["tokens"]) == tokens
        )
        return charged or _usage_refused(kind, q, lineage)

    def _charged_in_run(self, lineage: str, tokens: int) -> bool:
        """A settlement's charge: the ``UsageRecorded`` just before it in its append, or
        before the run of settlements it continues there, charges (or refuses) at least
        the run's tokens (the meter charges the run's sum in one), or its lease's
        refusal is (the lease having ended)."""
        kind, q, at = self._prev
        run = self._run
        if kind == "UsageRecorded" and at == self._at_text and q.get("lineage") == lineage:
            run = [lineage, int(q["amount"]["tokens"]) + int(q["refused"]["tokens"]), 0]
        elif _usage_refused(kind, q, lineage):
            run = [lineage, None, 0]
        elif not (kind == "ModelCallSettled" and at == self._at_text and run and run[0] == lineage):
            run = None
        self._run = run
        if run is None:
            return False
        if run[1] is None:  # the lease ended: settled alone, not charged
            return True
        run[2] += tokens
        return int(run[2]) <= int(run[1])

    def model_call_reserved(self, p: dict[str, Any], t: int) -> None:
        call, lineage, need = str(p["call"]), str(p["lineage"]), int(p["reserved"])
        if not self._first(self.called, call, lineage, f"model call {call} reserved"):
            return
        self.calls[call] = _Call(lineage, need, int(p["prompt_estimate"]), int(p["max_tokens"]))
        self.in_flight[lineage] = self.in_flight.get(lineage, 0) + need
        self._held_over(f"model call {call} reserved {need} tokens", lineage, t)

    def _drawn(self, p: dict[str, Any]) -> _Call | None:
        """A call drawn from a block, at its settlement (its one record): None when it
        settles on no block held by its lineage, or again."""
        call, lineage, block = str(p["call"]), str(p["lineage"]), str(p["block"])
        held = self.blocks.get(block)
        if not self._first(self.called, call, lineage, f"model call {call} settled"):
            return None
        if held is None or held.lineage != lineage:
            self.find("model-call", lineage, f"model call {call} settled on no block it holds")
            return None
        need, estimate, most = int(p["reserved"]), int(p["prompt_estimate"]), int(p["max_tokens"])
        if need != estimate + most or need > held.tokens:
            self.find(
                "model-call", lineage, f"model call {call} drew {need} tokens, not within its block"
            )
        held.charged += int(p["prompt_tokens"]) + int(p["completion_tokens"])
        return _Call(lineage, need, estimate, most)

    def model_call_settled(self, p: dict[str, Any], _: int) -> None:
        call, lineage = str(p["call"]), str(p["lineage"])
        if p.get("block") is not None:
            reserved = self._drawn(p)
            if reserved is None:
                return
        else:
            popped = self.calls.pop(call, None)
            if popped is None:
                again = "again" if call in self.called else "without a reservation"
                self.find("model-call", lineage, f"model call {call} settled {again}")
                return
            reserved = popped
            left = self.in_flight.get(reserved.lineage, 0) - reserved.reserved
            self.in_flight[reserved.lineage] = max(left, 0)
        if reserved.lineage != lineage:
            self.find(
                "model-call",
                lineage,
                f"model call {call} of {reserved.lineage} settled for {lineage}",
            )
        tokens = int(p["prompt_tokens"]) + int(p["completion_tokens"])
        if not self._charged_in_run(lineage, tokens):
            self.find(
                "model-call",
                lineage,
                f"model call {call}'s settlement does not charge its {tokens} tokens in its append",
            )
        estimated = bool(p["estimated"])
        if estimated == (p["how"] == "usage"):
            self.find(
                "model-call",
                lineage,
                f"model call {call} settled by {p['how']} with estimated {estimated}",
            )
        if estimated and (
            int(p["prompt_tokens"]) != reserved.prompt_estimate
            or int(p["completion_tokens"]) > reserved.max_tokens
        ):
            self.find(
                "model-call", lineage, f"model call {call}'s estimate exceeds its reservation"
            )

    # -- held credentials --------------------------------------------------------------

    def credential_injected(self, p: dict[str, Any], _: int) -> None:
        sandbox_id, secret = str(p["sandbox_id"]), str(p["secret"])
        destination = str(p["destination"])
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            self.find(
                "credential",
                None,
                f"secret {secret} injected in sandbox {sandbox_id}, which was never leased",
            )
            return
        lineage = sandbox.lineage
        if sandbox.injected is None:
            sandbox.injected = self.position
        if sandbox.withheld is not None:
            self.find(
                "credential",
                lineage,
                f"secret {secret} injected in sandbox {sandbox_id}, a test run that "
                f"withheld credentials at {sandbox.withheld}",
            )
        # An operator's sandbox (`charter sandbox run --secrets`) names its secrets on
        # the command line, which is not journaled: only its egress is checked.
        chain = None if lineage is None else self.chains.get(lineage)
        granted = () if chain is None else chain[-1].grant.terms.secrets
        if lineage is not None and secret not in granted:
            self.find(
                "credential",
                lineage,
                f"secret {secret} injected in sandbox {sandbox_id}; {lineage}'s grant "
                "does not name it",
            )
        host, port = _host_port(destination)
        if port is None or not any(admits(e, host, port) for e in sandbox.egress):
            self.find(
                "credential",
                lineage,
                f"secret {secret} injected for {destination}, which sandbox {sandbox_id}'s "
                "egress does not admit",
            )
        kind, q, at = self._prev
        dial = (
            at == self._at_text
            and kind in ("EgressOpened", "CredentialInjected")
            and q.get("sandbox_id") == sandbox_id
            and q.get("destination") == destination
        )
        if not dial:
            self.find(
                "credential",
                lineage,
                f"secret {secret} injected for {destination} without that dial's "
                "EgressOpened in its append",
            )

    def credential_withheld(self, p: dict[str, Any], _: int) -> None:
        sandbox = self.sandboxes.get(str(p["sandbox_id"]))
        if sandbox is None:
            return
        if sandbox.withheld is None:
            sandbox.withheld = self.position
        if sandbox.injected is not None:
            self.find(
                "credential",
                sandbox.lineage,
                f"sandbox {p['sandbox_id']} withheld secret {p['secret']} after it injected "
                f"one at {sandbox.injected}: a test run injects none",
            )

    # -- quarantines -------------------------------------------------------------------

    def quarantine_verdict(self, p: dict[str, Any], _: int) -> None:
        self.quarantines.add((str(p["lineage"]), str(p["sandbox_id"])))

    def workspace_digested(self, p: dict[str, Any], _: int) -> None:
        lineage, sandbox_id = str(p["lineage"]), str(p["sandbox_id"])
        self.digested.setdefault(lineage, self.position)
        if (lineage, sandbox_id) not in self.quarantines:
            self.find(
                "quarantine",
                lineage,
                f"{lineage}'s workspace in {sandbox_id} digested without a quarantine verdict",
            )
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None or sandbox.lineage != lineage:
            self.find(
                "quarantine",
                lineage,
                f"{lineage}'s workspace digested from sandbox {sandbox_id}, not leased for it",
            )
            return
        if sandbox.ended and p.get("digest") is not None:
            self.find(
                "quarantine",
                lineage,
                f"{lineage}'s workspace digested from sandbox {sandbox_id} after it ended",
            )
        worker = self.workers.get(lineage)
        live = worker is not None and not worker.ended and not sandbox.ended
        if live and lineage not in self.killed:
            self._must_kill = (lineage, self._at_text, self.position)

    def _kill_with_digest(self, kind: str, p: dict[str, Any]) -> None:
        """The entry after a live, unkilled worker's digest is its ``WorkerKilled``, in
        the digest's append."""
        assert self._must_kill is not None
        lineage, at, position = self._must_kill
        self._must_kill = None
        if kind == "WorkerKilled" and p.get("lineage") == lineage and at == self._at_text:
            return
        self.report(
            Finding(
                check="quarantine",
                position=position,
                lineage=lineage,
                detail=f"{lineage} quarantined live, its WorkerKilled not committed with "
                "its workspace digest",
            )
        )

    def worker_killed(self, p: dict[str, Any], _: int) -> None:
        self.killed.add(str(p["lineage"]))

    # -- admission ---------------------------------------------------------------------

    def _cell(self, name: str) -> _Cell:
        cell = self.cells.get(name)
        if cell is None:
            cell = self.cells[name] = _Cell({}, {}, {})
        return cell

    def cell_configured(self, p: dict[str, Any], _: int) -> None:
        cell = self._cell(str(p["cell"]))
        cell.caps = {str(k): int(v) for k, v in dict(p["caps"]).items()}
        for resource, held in cell.holders.items():
            if len(held) > cell.caps.get(resource, 0):
                self.find(
                    "admission",
                    None,
                    f"cell {p['cell']} configured with a {resource} cap of "
                    f"{cell.caps.get(resource, 0)}, below the {len(held)} slot(s) held",
                )

    def slot_queued(self, p: dict[str, Any], _: int) -> None:
        cell = self._cell(str(p["cell"]))
        queue = cell.queued.setdefault(str(p["resource"]), {})
        queue.update(dict.fromkeys(str(lineage) for lineage in p["lineages"]))

    def slot_admitted(self, p: dict[str, Any], _: int) -> None:
        name, lineage, resource = str(p["cell"]), str(p["lineage"]), str(p["resource"])
        cell = self._cell(name)
        held = cell.holders.setdefault(resource, set())
        queue = cell.queued.setdefault(resource, {})
        if not cell.caps:
            self.find("admission", lineage, f"a {resource} slot on unconfigured cell {name}")
        head = next(iter(queue), None)
        if head is not None and head != lineage:
            self.find(
                "admission",
                lineage,
                f"admitted to a {resource} slot on {name} ahead of the queue's head {head}",
            )
        queue.pop(lineage, None)
        held.add(lineage)
        cap = min(cell.caps.get(resource, 0), int(p["cap"]))
        if len(held) > cap:
            self.find(
                "admission",
                lineage,
                f"{len(held)} {resource} slots held on {name}, over its cap of {cap}",
            )

    def slot_released(self, p: dict[str, Any], _: int) -> None:
        # a holder gives its slot back, or a queued worker leaves (moved to another cell)
        cell, lineage, resource = self._cell(str(p["cell"])), str(p["lineage"]), str(p["resource"])
        cell.holders.setdefault(resource, set()).discard(lineage)
        cell.queued.setdefault(resource, {}).pop(lineage, None)

    # -- the fold --------------------------------------------------------------------

    def apply(self, position: int, topic: str, state: bytes) -> None:
        """One entry: :meth:`apply_rows` of one row."""
        self.apply_rows(((position, topic, state),))

    def apply_rows(self, rows: Iterable[tuple[int, str, bytes]]) -> None:
        """Entries in position order (the hot path: a million entries a run, a batch of
        rows a call). Each topic is looked up once, to its type and the one handler of
        the rules that read it (None: no rule reads that type); a topic not in
        :data:`KNOWN_TOPICS` is not in the table. A usage goes straight to its rule."""
        loads, books, ledgers = _loads, self.books, self._ledgers
        for position, topic, state in rows:
            self.position = position
            self.checked += 1
            try:
                doc = loads(state)
                at = doc["at"]
                if at != self._at_text:  # a batch's entries share one commit time
                    self._at_ms, self._at_text = _ms(at), at
                t = self._at_ms
                p: dict[str, Any] = doc["payload"]
            except (ValueError, KeyError, TypeError) as e:
                self.find("entry-format", None, f"the entry does not decode: {e}")
                continue
            if t < self.last_at:
                self.find(
                    "commit-order",
                    None,
                    f"committed at {t} ms, before the entry before it ({self.last_at} ms)",
                )
            else:
                self.last_at = t
            if topic == _USAGE and type(topic) is str:  # a usage: 99.9 % of a busy journal
                if self._must_kill is not None:
                    self._kill_with_digest("UsageRecorded", p)
                try:
                    lineage = p["lineage"]
                    lineage = lineage if type(lineage) is str else str(lineage)
                    amount = p["amount"]
                    egress = amount["egress_bytes"]
                    if egress:  # one dict update, and only for egress charged
                        self.egress[lineage] = self.egress.get(lineage, 0) + int(egress)
                    ledger = ledgers.get(lineage)
                    if ledger is None or t >= (
                        ledger.calm_until
                        if ledger.calm_epoch == books.epoch
                        else books.calm(ledger)
                    ):
                        self.usage(lineage, amount, ledger, t)
                    else:  # its whole chain live, counted live, within bounds: charged
                        a0, a1, a2, a3, a4 = v = _axes_of(amount)  # _vec, inlined
                        v = (
                            v
                            if type(a0) is int
                            and type(a1) is int
                            and type(a2) is int
                            and type(a3) is int
                            and type(a4) is int
                            else (int(a0), int(a1), int(a2), int(a3), int(a4))
                        )
                        if books.spend(ledger, v):
                            self._over(ledger, t)
                except (KeyError, TypeError, ValueError) as e:
                    self.find(
                        "entry-format", None, f"a UsageRecorded entry lacks what it must say: {e}"
                    )
                self._prev = ("UsageRecorded", p, self._at_text)
                continue
            self._other(topic, p, t)

    def _other(self, topic: str, p: dict[str, Any], t: int) -> None:
        """An entry not a usage: its topic looked up once, to its type and the one
        handler of the rules that read it (None: no rule reads that type)."""
        # A topic that is not a str (a tampered column) is no key of the table either.
        entry = self._dispatch.get(topic) if type(topic) is str else None
        if entry is None:
            self.find("entry-type", None, f"an entry of type {topic!r}, which Charter never writes")
            return
        kind, handler = entry
        if self._must_kill is not None:
            self._kill_with_digest(kind, p)
        if handler is not None:
            try:
                handler(p, t)
            except (KeyError, TypeError, ValueError) as e:
                self.find("entry-format", None, f"a {kind} entry lacks what it must say: {e}")
        self._prev = (kind, p, self._at_text)

    def _make_handlers(self) -> dict[str, Callable[[dict[str, Any], int], None]]:
        return {
            "JournalCreated": self.journal_created,
            "JournalKeyRotated": lambda p, _: self.key_rotated(p),
            "AgentRegistered": self.agent_registered,
            "GrantMinted": lambda p, _: self.grant_minted(p),
            "GateDecided": lambda p, _: self.gate_decided(p),
            "BudgetLedgerOpened": lambda p, _: self.ledger_opened(p),
            "LeaseGranted": self.lease_granted,
            # UsageRecorded: apply_rows itself (then usage)
            "LeaseReleased": self.released_lease,
            "LineageRevoked": lambda p, _: self.revoked(p),
            "LeaseRenewed": self.renewed,
            "SandboxLeased": self.sandbox_leased,
            "SandboxStarted": self.sandbox_started,
            "WorkerStarted": self.worker_started,
            "WorkerEnded": self.worker_ended,
            "WorkerScheduled": self.worker_scheduled,
            "WorkerResult": self.worker_result,
            "WorkerWaiting": self.worker_waiting,
            "BudgetRefused": self.budget_refused,
            "CellStarted": self.cell_started,
            "CellClaimRenewed": self.cell_claim_renewed,
            "CellConfigured": self.cell_configured,
            "SlotQueued": self.slot_queued,
            "SlotAdmitted": self.slot_admitted,
            "SlotReleased": self.slot_released,
            "ModelCallReserved": self.model_call_reserved,
            "ModelCallSettled": self.model_call_settled,
            "ModelTokensHeld": self.model_tokens_held,
            "ModelTokensReleased": self.model_tokens_released,
            "CredentialInjected": self.credential_injected,
            "CredentialWithheld": self.credential_withheld,
            "QuarantineVerdict": self.quarantine_verdict,
            "WorkspaceDigested": self.workspace_digested,
            "WorkerKilled": self.worker_killed,
            "OutwardIntent": lambda p, _: self.outward_intent(p),
            "OutwardOutcome": lambda p, _: self.outward_outcome(p),
            "DelegationRequested": lambda p, _: self.delegation_requested(p),
            "DelegationReplied": lambda p, _: self.delegation_replied(p),
            **{end: lambda p, _: self.sandbox_ended(p) for end in _ENDS},
        }

    def delegation_requested(self, p: dict[str, Any]) -> None:
        caller, delegate = str(p["caller"]), str(p["delegate"])
        if delegate in self.delegations or self.books.get(delegate) is not None:
            self.find(
                "delegation", delegate,
                f"delegation to {delegate} journaled after it was delegated or reserved",
            )  # fmt: skip
            return
        if caller in self.delegations:
            self.find("delegation", caller, f"{caller} is a delegate and delegated to {delegate}")
        self.delegations[delegate] = _Delegation(caller)

    def _delegate_leased(self, lineages: list[str], parent: str) -> None:
        for lineage in lineages:
            d = self.delegations.get(lineage)
            if d is not None and parent != d.caller:
                self.find(
                    "delegation", lineage,
                    f"delegate {lineage} reserved out of {parent}, not its caller {d.caller}",
                )  # fmt: skip

    def _delegate_started(self, lineage: str) -> None:
        d = self.delegations.get(lineage)
        if d is not None and d.replied:
            self.find("delegation", lineage, f"delegate {lineage} started after its reply")

    def delegation_replied(self, p: dict[str, Any]) -> None:
        delegate = str(p["delegate"])
        d = self.delegations.get(delegate)
        if d is None:
            self.find("delegation", delegate, f"a reply of {delegate}, never delegated to")
        elif d.replied:
            self.find("delegation", delegate, f"a second reply of delegate {delegate}")
        elif str(p["caller"]) != d.caller:
            self.find("delegation", delegate, f"{delegate}'s reply to another than its caller")
        else:
            if delegate not in self.ended_workers:
                self.find("delegation", delegate, f"{delegate} replied before it ended")
            d.replied = True

    def outward_intent(self, p: dict[str, Any]) -> None:
        lineage, key = str(p["lineage"]), str(p["key"])
        if (lineage, key) in self.outward:
            self.find("outward-call", lineage, f"a second intent for idempotency key {key!r}")
            return
        self.outward[(lineage, key)] = False

    def outward_outcome(self, p: dict[str, Any]) -> None:
        lineage, key = str(p["lineage"]), str(p["key"])
        done = self.outward.get((lineage, key))
        if done is None:
            self.find("outward-call", lineage, f"an outcome for key {key!r} with no intent")
        elif done:
            self.find("outward-call", lineage, f"a second outcome for key {key!r}")
        else:
            self.outward[(lineage, key)] = True

    def journal_created(self, p: dict[str, Any], _: int) -> None:
        key = str(p["journal_key"])
        self.keys = KeyHistory.start(journal_origin(key), bytes.fromhex(key))

    def agent_registered(self, p: dict[str, Any], _: int) -> None:
        lineage, name = str(p["lineage"]), str(p["name"])
        trust_root = bytes.fromhex(p["trust_root"])
        if lineage != f"agent:{name}":
            self.find("trust-anchor", lineage, f"{name!r} registered as {lineage}")
            return
        first = self.registered.get(lineage)
        if first is not None:
            self.find(
                "trust-anchor",
                lineage,
                f"{lineage} registered again (first at position {first}) with trust root "
                f"{trust_root.hex()[:16]}…; the first registration's trust root stays",
            )
            return
        self.registered[lineage] = self.position
        self.trust_roots[lineage] = trust_root


class Auditor:
    """The audit as a stream: :meth:`apply` each entry in position order (each finding
    goes to ``on_finding`` as it is found), then :meth:`finish` (the findings that only
    the end can show: what never ended). Its memory is the books it keeps (ledgers,
    grants, sandboxes, workers, cells, gates: one record per name), never the entries."""

    def __init__(self, on_finding: Callable[[Finding], None] | None = None) -> None:
        self._auditor = _Auditor(on_finding)
        self.apply: Callable[[int, str, bytes], None] = self._auditor.apply  # the hot path
        self.apply_rows: Callable[[Iterable[tuple[int, str, bytes]]], None] = (
            self._auditor.apply_rows
        )

    def finish(self) -> AuditReport:
        auditor = self._auditor
        if auditor._must_kill is not None:  # the journal ends after the digest
            auditor._kill_with_digest("", {})
        auditor.lifecycle(auditor.last_at)
        findings = tuple(sorted(auditor.findings, key=lambda f: (f.position, f.check)))
        return AuditReport(ok=not findings, checked=auditor.checked, findings=findings)


def audit_history(
    rows: Iterable[Iterable[tuple[int, str, bytes]]],
    on_finding: Callable[[Finding], None] | None = None,
) -> AuditReport:
    """Audit batches of ``(position, topic, state)`` in position order (what
    ``Journal.payloads`` yields), one batch at a time."""
    auditor = Auditor(on_finding)
    apply_rows = auditor.apply_rows
    for batch in rows:
        apply_rows(batch)
    return auditor.finish()
