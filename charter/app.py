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
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from charter.authority import GatePolicy, SpawnIntent
from charter.budgets import FabricCeilings, ResourceClass
from charter.control import (
    DEFAULT_CELL,
    AdmissionService,
    AgentRecord,
    BudgetService,
    Ceiling,
    ResourceView,
    SpawnResult,
    SpawnService,
    WorkerSpec,
    custody_key_name,
    register_root,
)
from charter.core import (
    BadInputError,
    Budget,
    CharterError,
    KeyStore,
    Lineage,
    StateError,
    charter_home,
)
from charter.ledger import Journal, JournalCreated, Location, resolve_location
from charter.projections import Projector
from charter.sandbox import (
    EgressBroker,
    EgressGrant,
    Launcher,
    Outcome,
    WarmPool,
    default_state_dir,
)

__all__ = ["JOURNAL_KEY", "CellSetup", "Charter", "Initialised", "Settings"]

JOURNAL_KEY = "journal"


class Settings(BaseModel):
    """Configuration that is not in the journal: the fabric ceilings and this host's cell."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ceilings: FabricCeilings = FabricCeilings()
    cell: str = Field(default=DEFAULT_CELL, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """``CHARTER_POPULATION_CEILING``, ``CHARTER_DEPTH_CEILING`` and ``CHARTER_CELL``.

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
        try:
            return cls(
                ceilings=FabricCeilings(**ceilings), cell=env.get("CHARTER_CELL", DEFAULT_CELL)
            )
        except ValidationError as e:
            raise BadInputError(f"Charter settings from the environment: {e}") from e


class CellSetup(BaseModel):
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
    """An open journal, its home, and the services built on them."""

    def __init__(self, journal: Journal, keys: KeyStore, settings: Settings) -> None:
        self.journal = journal
        self.keys = keys
        self.settings = settings

    # -- opening -----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        db: str | Location | None = None,
        *,
        keys: KeyStore | None = None,
        settings: Settings | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Charter:
        """Open an existing journal (``--db``, ``CHARTER_DB`` or the home's SQLite file)."""
        return cls(
            Journal.open(db, env=env),
            keys or KeyStore(charter_home()),
            settings or Settings.from_env(),
        )

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
        cell. Nothing is left half-made: on any failure, what this call created is
        removed again (a PostgreSQL database is the operator's and is left to them)."""
        location = resolve_location(db)
        keys = keys or KeyStore(charter_home())
        settings = settings or Settings.from_env()
        Journal.refuse_existing(location)  # refuse before writing anything
        if keys.exists(JOURNAL_KEY):
            raise StateError(
                f"the Charter home {keys.home} already has a journal key; it belongs to an "
                "existing journal (use that one, or set CHARTER_HOME to a new directory)"
            )
        key = keys.create(JOURNAL_KEY)
        public = bytes(key.verify_key).hex()
        try:
            journal = Journal.create(location, journal_key=public)
        except CharterError:
            keys.remove(JOURNAL_KEY)  # no key without its journal
            raise
        charter = cls(journal, keys, settings)
        registered = False
        try:
            journal.append([JournalCreated(journal_key=public, created_at=journal.meta.created_at)])
            record = register_root(journal, keys, root, ceiling)
            registered = True
            setup = cell or CellSetup.for_host()
            charter.admission().configure(
                settings.cell, setup.caps(), cores=setup.cores, failover_reserve=setup.reserve
            )
        except BaseException:
            journal.discard_new()  # no journal without its root and cell
            keys.remove(JOURNAL_KEY)
            if registered:
                keys.remove(custody_key_name(root))
            raise
        return charter, Initialised(location, str(keys.home), public, record, journal.head())

    def close(self) -> None:
        self.journal.close()

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

    def spawn_service(self, policy: GatePolicy | None = None) -> SpawnService:
        return SpawnService(
            self.journal,
            keystore=self.keys,
            policy=policy,
            ceilings=self.settings.ceilings,
            cell=self.settings.cell,
        )

    def budgets(self) -> BudgetService:
        return BudgetService(self.journal)

    def admission(self) -> AdmissionService:
        return AdmissionService(self.journal)

    def projector(self) -> Projector:
        """The read side (a context manager): budgets, tree and slots as of any position."""
        return Projector(self.journal)

    # -- the directory and fan-outs ----------------------------------------------

    def agents(self) -> list[AgentRecord]:
        return self.spawn_service().agents()

    def add_agent(self, name: str, ceiling: Ceiling) -> AgentRecord:
        return register_root(self.journal, self.keys, name, ceiling)

    def spawn(
        self,
        parent: str | Lineage,
        intent: SpawnIntent,
        *,
        policy: GatePolicy | None = None,
        workers: tuple[WorkerSpec, ...] | None = None,
    ) -> SpawnResult:
        """A fan-out under durable agent ``parent`` (``agent:NAME``), as its operator;
        with ``workers``, each child is scheduled to run on this host's cell."""
        lineage = parent if isinstance(parent, Lineage) else Lineage(parent)
        if not lineage.is_root:
            raise BadInputError(
                f"{lineage} is a worker: workers spawn through their door, not as an "
                "operator; give a durable agent (agent:NAME)"
            )
        service = self.spawn_service(policy)
        return service.spawn(service.durable_caller(lineage.root_name), intent, workers)

    def processing_cap(self, cell: str | None = None) -> int:
        """The cell's committed processing cap (what ``cell configure``/``init`` journaled)."""
        name = cell or self.settings.cell
        resources = ResourceView()
        resources.refresh(self.journal)
        return resources.cells.get(name).caps.get(ResourceClass.PROCESSING, 0)

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
                broker = stack.enter_context(EgressBroker(state / f"egress-{os.getpid()}.sock"))
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
