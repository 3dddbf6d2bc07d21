"""The composition root: one place that opens a journal and a home, reads the
configuration, and builds the services every command and the Python API use.

``Charter.initialise`` makes a new journal with its root agent and local cell;
``Charter.open`` opens an existing one. Everything else (the CLI, tests, the runner)
goes through a :class:`Charter`::

    with Charter.open() as charter:
        result = charter.spawn("agent:estate", SpawnIntent(...))
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from pydantic import ConfigDict, Field, ValidationError, model_validator

from charter.audit.keys import JOURNAL_KEY
from charter.authority import GatePolicy, SpawnIntent
from charter.budgets import CapInputs, FabricCeilings, ResourceClass
from charter.control import (
    DEFAULT_CELL,
    AdmissionService,
    AgentRecord,
    BudgetService,
    Caller,
    Ceiling,
    HostLoad,
    OwnSandboxDeclared,
    SpawnResult,
    SpawnService,
    VerdictAction,
    Views,
    WorkerSpec,
    custody_key_name,
    host_cap_inputs,
    operator_verdict,
    register_root,
    revoke,
    steady_load,
)
from charter.control.trifecta import home_trifecta
from charter.core import (
    BadInputError,
    Budget,
    CharterError,
    CheckedModel,
    KeyStore,
    Lineage,
    StateError,
    charter_home,
    describe_invalid,
    now_ms,
)
from charter.ledger import Journal, JournalCreated, Location, SnapshotFile, resolve_location
from charter.projections import Projector
from charter.sandbox import (
    Credentials,
    EgressBroker,
    EgressGrant,
    Launcher,
    Outcome,
    WarmPool,
    default_state_dir,
)

__all__ = [
    "JOURNAL_KEY",
    "CellFactory",
    "CellOptions",
    "CellRunner",
    "CellSetup",
    "Charter",
    "Initialised",
    "Settings",
    # what the CLI needs of the journal itself (it reaches the ledger only here)
    "Journal",
    "Location",
    "provide_cells",
    "read_journal",
    "resolve_location",
]


def read_journal(db: str | Location | None = None) -> Journal:
    """The journal at ``db`` (``--db``, ``CHARTER_DB`` or the home's) only to read
    (verify, show): nothing is written, and a file this user may not write is read
    without side files (see :meth:`Journal.open`)."""
    return Journal.open(db, read_only=True)


class Settings(CheckedModel):
    """Configuration that is not in the journal: the fabric ceilings and this host's cell."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ceilings: FabricCeilings = FabricCeilings()
    cell: str = Field(default=DEFAULT_CELL, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    # PostgreSQL: how long a writer waits for the journal's write lock, and how long any
    # journal statement may run, before it gives up with WriterStalledError.
    pg_lock_timeout_s: int = Field(default=30, ge=1, le=3600)
    pg_statement_timeout_s: float = Field(default=60.0, gt=0, le=86_400)

    def journal_env(self) -> dict[str, str]:
        """The journal settings these carry (see ``Journal.open``'s ``env``)."""
        return {
            "POSTGRES_LOCK_TIMEOUT": str(self.pg_lock_timeout_s),
            "POSTGRES_STATEMENT_TIMEOUT": repr(self.pg_statement_timeout_s),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """``CHARTER_POPULATION_CEILING``, ``CHARTER_DEPTH_CEILING``, ``CHARTER_CELL``,
        ``CHARTER_PG_LOCK_TIMEOUT`` and ``CHARTER_PG_STATEMENT_TIMEOUT`` (seconds).

        A malformed value is bad input: the ceilings fail open only when the registry
        cannot be read, never on a typo.
        """
        env = os.environ if environ is None else environ
        ceilings: dict[str, Any] = {}
        for key, name in (("population", "POPULATION"), ("depth", "DEPTH")):
            text = env.get(f"CHARTER_{name}_CEILING")
            if text is not None:
                if not (text.isascii() and text.isdigit()):
                    raise BadInputError(
                        f"CHARTER_{name}_CEILING={text!r} is not a whole number >= 0; fix or "
                        "unset it"
                    )
                ceilings[key] = int(text)
        timeouts = {
            field: env[name]
            for field, name in (
                ("pg_lock_timeout_s", "CHARTER_PG_LOCK_TIMEOUT"),
                ("pg_statement_timeout_s", "CHARTER_PG_STATEMENT_TIMEOUT"),
            )
            if name in env
        }
        try:
            return cls(
                ceilings=FabricCeilings(**ceilings),
                cell=env.get("CHARTER_CELL", DEFAULT_CELL),
                **timeouts,
            )
        except ValidationError as e:
            raise BadInputError(
                f"Charter settings from the environment: {describe_invalid(e)}"
            ) from e


class CellSetup(CheckedModel):
    """A cell's caps as an operator configures them (``init`` and ``cell configure``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cores: int = Field(ge=1, le=65_536)
    reserve: int = Field(default=0, ge=0, le=65_536)
    processing: int | None = Field(default=None, ge=0, le=1_000_000)
    coordination: int | None = Field(default=None, ge=0, le=1_000_000)
    egress: int | None = Field(default=None, ge=0, le=1_000_000)
    inference: int | None = Field(default=None, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _leaves_a_core(self) -> CellSetup:
        if self.reserve >= self.cores:
            raise ValueError(
                f"a reserve of {self.reserve} leaves none of {self.cores} cores to run workers"
            )
        return self

    @classmethod
    def for_host(cls) -> CellSetup:
        return cls(cores=os.cpu_count() or 1)

    def caps(self) -> dict[ResourceClass, int]:
        """Explicit caps, else: processing = cores − reserve; a waiting coordinator
        holds no core, so coordination defaults to 64 per core; egress and inference
        to 4 per core."""
        usable = max(0, self.cores - self.reserve)
        return {
            ResourceClass.PROCESSING: usable if self.processing is None else self.processing,
            ResourceClass.COORDINATION: (
                64 * self.cores if self.coordination is None else self.coordination
            ),
            ResourceClass.EGRESS: 4 * self.cores if self.egress is None else self.egress,
            ResourceClass.INFERENCE: 4 * self.cores if self.inference is None else self.inference,
        }


@dataclass(frozen=True)
class CellOptions:
    """How :meth:`Charter.cell` was asked to run a cell: its id (resolved: the
    settings' cell by default) and what the runner defaults when None (the most one
    worker's sandbox may get, the state directory, the workers' template, how long a
    claim holds), and whether to fence a live incarnation at once."""

    cell: str
    slot_budget: Budget | None = None
    state_dir: Path | None = None
    template: Path | None = None
    claim_s: float | None = None
    take_over: bool = False
    classes: tuple[str, ...] = ()  # the classes of work it takes (docs/fabric.md)


class CellRunner(Protocol):
    """A cell as :meth:`Charter.cell` hands it out (``charter.runner.Cell``): ``open``
    it (it journals its incarnation and recovers), ``run`` or ``step`` it, ``close``
    it; ``draining`` starts nothing more."""

    cell: str
    incarnation: int
    draining: bool

    def open(self) -> object: ...

    def run(self, until: Callable[[], bool] = ..., poll_s: float = ...) -> None: ...

    def step(self) -> int: ...

    def idle(self) -> bool: ...

    def running(self) -> int: ...

    def close(self) -> None: ...


class CellFactory(Protocol):
    """Builds a cell (and its door) on a composition root's services."""

    def __call__(self, charter: Charter, options: CellOptions, /) -> CellRunner: ...


_cells: list[CellFactory] = []  # the one registered: the runner's (provide_cells)


def provide_cells(factory: CellFactory, *, replace: bool = True) -> None:
    """Register how this process builds a cell for :meth:`Charter.cell` (with
    ``replace=False``, only if none is registered yet). The runner, the layer above the
    composition root (docs/architecture.md), registers its own when it is imported
    (``charter.runner``; the ``charter`` package registers one that imports the runner
    on the first cell), so the root hands a cell its services without importing the
    layer above."""
    if replace or not _cells:
        _cells[:] = [factory]


class _InitMarker:
    """``<home>/init-unfinished``: which journal (and root) an init in this home began,
    written before it creates anything and removed when it has finished. It is what
    lets a re-run resume, and tells an unfinished journal of this home from another's."""

    def __init__(self, home: Path) -> None:
        self.path = home / "init-unfinished"

    def resume(self, location: Location, root: str) -> bool:
        """True if an init of this same journal and root was left unfinished here."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return False
        recorded = text.splitlines()
        if recorded != [location.display, root]:
            shown = " (root ".join(recorded) + ")" if len(recorded) == 2 else text.strip()
            raise StateError(
                f"an unfinished `charter init` of {shown} is in {self.path.parent}; finish "
                f"it with the same --db and --root, or remove {self.path} and what it made"
            )
        return True

    def begin(self, location: Location, root: str) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:  # O_EXCL: two inits in one home cannot both begin
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise StateError(f"another `charter init` is running in {self.path.parent}") from None
        with os.fdopen(fd, "w") as f:
            f.write(f"{location.display}\n{root}\n")
            f.flush()
            os.fsync(f.fileno())

    def end(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Initialised:
    """What ``Charter.initialise`` made."""

    location: Location
    home: str
    journal_key: str
    root: AgentRecord
    head: tuple[int, bytes] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "journal": self.location.display,
            "home": self.home,
            "journal_key": self.journal_key,
            "root": self.root.to_json(),
            "head": ({"position": self.head[0], "hash": self.head[1].hex()} if self.head else None),
        }


class Charter:
    """An open journal, its home, and the services built on them: the process's one
    composition root.

    It builds, once, the views every decision reads (:class:`Views`, kept current
    incrementally from their position) and the handlers that decide on them: one
    :class:`SpawnService`, one :class:`BudgetService`, one :class:`AdmissionService`.
    Every face goes through them: the CLI, the Python API, the cell and a worker's
    door (a worker's spawn is :meth:`spawn` with the worker's :class:`Caller`), so the
    operator's ceilings and gate policy hold for all of them, and no decision folds
    the journal from its start again.
    """

    def __init__(
        self,
        journal: Journal,
        keys: KeyStore,
        settings: Settings,
        *,
        policy: GatePolicy | None = None,
    ) -> None:
        self.journal = journal
        self.keys = keys
        self.settings = settings
        # The adaptive processing cap's inputs: the host's load unless a cell of this
        # process was told to ignore it (``cell(ignore_host_load=True)``).
        self.host_load: HostLoad = host_cap_inputs
        # The views start from this home's snapshot of this journal, when it matches.
        self.views = Views(SnapshotFile(keys.home / "views", journal, "views"))
        self._spawner = SpawnService(
            journal,
            keystore=keys,
            policy=policy,
            ceilings=settings.ceilings,
            cell=settings.cell,
            host_load=self._host_load,
            views=self.views,
            # the lethal trifecta, refused at mint; the home's policy read at the first
            # fan-out (an auditor's process never reads it)
            trifecta=functools.cache(functools.partial(home_trifecta, keys.home)),
        )
        self._budgets = BudgetService(journal, shared=self.views)
        self._admission = AdmissionService(
            journal,
            shared=self.views,
            host_load=self._host_load,
            # the other live cells on a cell's host share its cores (docs/fabric.md)
            peers=lambda cell: self._spawner.liveness.peers_on_host(cell, now_ms()),
        )

    def _host_load(self, cores: int, reserve: int) -> CapInputs:
        return self.host_load(cores, reserve)

    # -- opening -----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        db: str | Location | None = None,
        *,
        keys: KeyStore | None = None,
        settings: Settings | None = None,
        env: Mapping[str, str] | None = None,
        read_only: bool = False,
        policy: GatePolicy | None = None,
    ) -> Charter:
        """Open an existing journal (``--db``, ``CHARTER_DB`` or the home's SQLite file);
        ``read_only``: only to read it (see :meth:`Journal.open`); ``policy``: the gate
        every fan-out of this process asks (default: the cost-benefit policy)."""
        settings = settings or Settings.from_env()
        journal = Journal.open(
            db, env={**settings.journal_env(), **(env or {})}, read_only=read_only
        )
        return cls(journal, keys or KeyStore(charter_home()), settings, policy=policy)

    @classmethod
    def initialise(
        cls,
        db: str | Location | None = None,
        *,
        root: str,
        ceiling: Ceiling,
        cell: CellSetup | None = None,
        keys: KeyStore | None = None,
        settings: Settings | None = None,
    ) -> tuple[Charter, Initialised]:
        """Create the journal (once), its signing key, the root agent and the local
        cell, as named steps that a re-run resumes: an init that was killed midway is
        finished by running it again (same home, same --db, same root), each step done
        only if it is not done yet. Never deletes what it did not create in this run; a
        journal it finds there that is not its own is refused, nothing written."""
        location = resolve_location(db)
        keys = keys or KeyStore(charter_home())
        settings = settings or Settings.from_env()
        marker = _InitMarker(keys.home)
        resuming = marker.resume(location, root)
        if not resuming:
            Journal.refuse_existing(location)  # refuse before writing anything
            if keys.exists(JOURNAL_KEY):
                raise StateError(
                    f"the Charter home {keys.home} already has a journal key; it belongs to "
                    "an existing journal (use that one, or set CHARTER_HOME to a new directory)"
                )
            marker.begin(location, root)
        # Step 1: the journal's signing key.
        key = keys.load(JOURNAL_KEY) if resuming and keys.exists(JOURNAL_KEY) else None
        made_key = key is None
        key = key or keys.create(JOURNAL_KEY)
        public = bytes(key.verify_key).hex()
        # Step 2: the schema and its metadata (all or nothing), naming that key.
        try:
            journal = Journal.create(location, journal_key=public, resume=resuming)
        except CharterError:
            if not resuming:  # nothing else was made: undo this run's key and marker
                if made_key:
                    keys.remove(JOURNAL_KEY)
                marker.end()
            raise
        charter = cls(journal, keys, settings)
        try:
            record = charter._finish_init(public, root, ceiling, cell or CellSetup.for_host())
        except BaseException as e:
            charter.close()
            if isinstance(e, CharterError):
                e.add_note("(initialisation is unfinished: run the same `charter init` again)")
            raise
        marker.end()
        return charter, Initialised(location, str(keys.home), public, record, journal.head())

    def _finish_init(
        self, public: str, root: str, ceiling: Ceiling, setup: CellSetup
    ) -> AgentRecord:
        """Steps 3-5 of init, each skipped when the journal shows it done."""
        journal = self.journal
        if journal.meta.journal_key != public:
            raise StateError(
                f"{journal.location.display} was made with another journal key; it is not "
                "this home's unfinished journal (refusing to touch it)"
            )
        first = next(iter(journal.entries(1, 1)), None)
        if first is None:  # Step 3: the first entry names the key
            journal.append([JournalCreated(journal_key=public, created_at=journal.meta.created_at)])
        elif not isinstance(first.event, JournalCreated):
            raise StateError(f"{journal.location.display} does not begin with JournalCreated")
        lineage = Lineage.root(root)
        if not journal.stream_version(str(lineage)):  # Step 4: the root agent
            # A custody key without its directory entry can only be this unfinished
            # init's (killed between making it and journaling it): make it afresh.
            self.keys.remove(custody_key_name(root))
            record = register_root(journal, self.keys, root, ceiling)
        else:
            record = self.spawn_service().agent(root)
        if not journal.stream_version(f"cell:{self.settings.cell}"):  # Step 5: the cell
            self.configure_cell(setup)
        return record

    def close(self) -> None:
        """Save the views (if they moved far enough: ``Views.save``), close the journal."""
        try:
            self.save_views()
        finally:
            self.journal.close()

    def save_views(self) -> bool:
        """Snapshot the views for the next process (a long-lived one may call it at
        any time): True if saved. Never fails a command: a snapshot is a cache."""
        try:
            return self.views.save()
        except (OSError, CharterError):
            return False

    def __enter__(self) -> Charter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- services ----------------------------------------------------------------

    def spawn_service(self) -> SpawnService:
        """The process's one spawn pipeline (built with the root, never again)."""
        return self._spawner

    def budgets(self) -> BudgetService:
        return self._budgets

    def admission(self) -> AdmissionService:
        return self._admission

    def cell(
        self,
        *,
        cell: str | None = None,
        slot_budget: Budget | None = None,
        state_dir: Path | None = None,
        template: Path | None = None,
        ignore_host_load: bool = False,
        claim_s: float | None = None,
        take_over: bool = False,
        classes: tuple[str, ...] = (),
    ) -> CellRunner:
        """A cell (not opened yet) of this host, with its door, on this root's
        services: its spawn pipeline, budgets, admission and views (the cell builds
        none). ``cell``: its id (default: the settings' cell); ``slot_budget``: the
        most one worker's sandbox may get (each worker runs under its own lease,
        narrowed from it); ``ignore_host_load`` makes every decision of this process
        ignore the load average; the cell holds its id by a claim of ``claim_s``
        seconds it renews, and ``take_over`` fences a live incarnation at once instead
        of waiting for its claim to lapse; ``classes`` are the classes of work it takes
        (journaled with its incarnation: a worker asking one is placed only on a live
        cell that has it, docs/fabric.md). Run it with ``charter.runner.run_cell`` (or
        ``open``, ``run``, ``close``). The runner builds it (:func:`provide_cells`)."""
        if not _cells:
            raise StateError(
                "no cell runner is loaded in this process: import charter.runner (it "
                "registers how a cell is built), or reach Charter as charter.Charter"
            )
        if ignore_host_load:
            self.host_load = steady_load
        options = CellOptions(
            cell=cell or self.settings.cell,
            slot_budget=slot_budget,
            state_dir=state_dir,
            template=template,
            claim_s=claim_s,
            take_over=take_over,
            classes=classes,
        )
        return _cells[0](self, options)

    def projector(self) -> Projector:
        """The read side (a context manager): budgets, tree and slots as of any position."""
        return Projector(self.journal)

    # -- the directory and fan-outs ----------------------------------------------

    def agents(self) -> list[AgentRecord]:
        return self._spawner.agents()

    def add_agent(
        self,
        name: str,
        ceiling: Ceiling,
        *,
        own_sandbox: tuple[str, ...] | None = None,
        delegate_budget: Budget | None = None,
    ) -> AgentRecord:
        """Register durable agent ``name`` under ``ceiling``. With ``own_sandbox`` (the
        program it runs) and ``delegate_budget``, it is an own-sandbox agent
        (docs/delegation.md): workers may delegate to it, each delegation running that
        program under the ceiling (its declared tools, egress and secrets) and
        reserving ``delegate_budget`` from the caller; its ``OwnSandboxDeclared`` joins
        the registration's append."""
        if own_sandbox is None:
            if delegate_budget is not None:
                raise BadInputError("a delegation budget is for an own-sandbox agent")
            return register_root(self.journal, self.keys, name, ceiling)
        if delegate_budget is None:
            raise BadInputError("an own-sandbox agent declares what one delegation reserves")
        if ceiling.depth < 1:
            raise BadInputError(
                "an own-sandbox agent needs depth 1 or more: each delegation is minted one "
                "level below it (the delegate itself gets depth 0 and cannot spawn)"
            )
        if not delegate_budget.fits_within(ceiling.budget):
            raise BadInputError(
                f"a delegation's budget {delegate_budget.render()} is more than the agent's "
                f"ceiling {ceiling.budget.render()} holds"
            )
        try:
            argv = WorkerSpec(argv=own_sandbox).argv
        except ValidationError as e:
            raise BadInputError(f"the own-sandbox program: {describe_invalid(e)}") from e
        declared = OwnSandboxDeclared(
            name=name, lineage=Lineage.root(name), argv=argv, budget=delegate_budget
        )
        return register_root(self.journal, self.keys, name, ceiling, declared=(declared,))

    def delegate(self, caller: Caller, agent: str, inputs: tuple[str, ...] = ()) -> SpawnResult:
        """``caller`` (a worker, as its door resolves it) delegates to own-sandbox agent
        ``agent`` (:meth:`SpawnService.delegate`): one delegate scheduled on this host's
        cell, its lease carved out of the caller's remainder."""
        return self._spawner.delegate(caller, agent, inputs)

    def spawn(
        self,
        parent: str | Lineage | Caller,
        intent: SpawnIntent,
        *,
        policy: GatePolicy | None = None,
        workers: tuple[WorkerSpec, ...] | None = None,
        request_id: str | None = None,
    ) -> SpawnResult:
        """A fan-out under ``parent``: a durable agent (``agent:NAME``) as its operator,
        or a worker's :class:`Caller` (its door resolves it from the sandbox). With
        ``workers``, each child is scheduled to run on this host's cell. Give
        ``request_id`` to make a retry safe (see ``SpawnService.spawn``); ``policy``
        asks another gate for this one fan-out."""
        service = self._spawner
        if isinstance(parent, Caller):
            caller = parent
        else:
            lineage = parent if isinstance(parent, Lineage) else Lineage(parent)
            if not lineage.is_root:
                raise BadInputError(
                    f"{lineage} is a worker: workers spawn through their door, not as an "
                    "operator; give a durable agent (agent:NAME)"
                )
            caller = service.durable_caller(lineage.root_name)
        return service.spawn(caller, intent, workers, request_id=request_id, policy=policy)

    def revoke(self, lineage: str | Lineage, reason: str = "") -> int | None:
        """Revoke a worker and its subtree (one append; the position it committed at,
        or None if it already was revoked). From there none of them may spawn, be
        admitted or start, and the cell that runs them kills what runs, each kill
        journaled first, charging what they used before their leases return."""
        target = lineage if isinstance(lineage, Lineage) else Lineage(lineage)
        committed = revoke(self.journal, self.views, target, reason or "revoked by the operator")
        return None if committed is None else committed.position

    def verdict(
        self,
        lineage: str | Lineage,
        action: VerdictAction,
        *,
        reason: str = "",
        quota_permille: int | None = None,
        operator: str = "operator",
    ) -> int:
        """Append an operator's verdict on a started worker (its position): the cell
        that runs it carries it out (docs/supervision.md, "Verdicts and what each does")."""
        target = lineage if isinstance(lineage, Lineage) else Lineage(lineage)
        committed = operator_verdict(
            self.journal, target, action, operator=operator, reason=reason,
            quota_permille=quota_permille,
        )  # fmt: skip
        return committed.position

    def processing_cap(self, cell: str | None = None) -> int:
        """The cell's committed processing cap (what ``cell configure``/``init`` journaled)."""
        name = cell or self.settings.cell
        with self.views.lock:
            self.views.refresh(self.journal)
            return self.views.resources.cells.get(name).caps.get(ResourceClass.PROCESSING, 0)

    def warm_pool(self, template: Path, budget: Budget, **options: Any) -> WarmPool:
        """A warm pool for this host's cell whose capacity *is* the cell's committed
        processing cap: one admission mechanism, so the pool and the cell's slots can
        never disagree. Its lifecycle is journaled here."""
        return WarmPool(
            template,
            budget,
            self.processing_cap(),
            sink=self.journal,
            name=self.settings.cell,
            **options,
        )

    def run_sandbox(
        self,
        budget: Budget,
        command: list[str],
        *,
        workspace: Path | None = None,
        egress: EgressGrant | None = None,
        stdout: int | None = None,
    ) -> Outcome:
        """Run ``command`` in a fresh sandbox as the operator's own run (no worker, no
        lease: ``SandboxLeased`` names no lineage), journaled end to end. An egress
        broker is started for the run when the grant names a destination."""
        state = default_state_dir()
        with contextlib.ExitStack() as stack:
            broker = None
            if egress is not None and egress.destinations:
                # The grant's held secrets, opened from the home for the broker alone.
                held = (
                    Credentials.from_home(self.keys.home, egress.secrets)
                    if egress.secrets
                    else None
                )
                sock = state / f"egress-{os.getpid()}.sock"
                broker = stack.enter_context(EgressBroker(sock, credentials=held))
            # The Launcher passes the isolation gate (journaled) first.
            launcher = Launcher(self.journal, state_dir=state, egress=broker)
            return launcher.run(budget, command, workspace=workspace, grant=egress, stdout=stdout)

    def configure_cell(self, setup: CellSetup, cell: str | None = None) -> None:
        self.admission().configure(
            cell or self.settings.cell,
            setup.caps(),
            cores=setup.cores,
            failover_reserve=setup.reserve,
        )
