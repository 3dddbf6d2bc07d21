"""Every named error no other test raised, raised through the code path that raises it
for real (never by instantiating it here), with its fault group asserted.

Covered elsewhere in this directory: KeyPermissionsError, PoolCapacityError,
KeySeedError, SignatureTagError and HostFactsError (test_fault_groups.py).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.app import CellSetup, Charter
from charter.audit import ChainBrokenError, ChainHead, Fault, verify_chain
from charter.authority import SpawnIntent
from charter.budgets import BudgetRefusedError, NoBudgetLedgerError, UnknownLeaseError
from charter.control import Ceiling, register_root
from charter.core import (
    BadInputError,
    Budget,
    CharterError,
    Event,
    InternalError,
    KeyNotFoundError,
    KeyStore,
    RefusedError,
    StateError,
    TamperedError,
    UnknownEventTypeError,
    event_class,
)
from charter.ledger import (
    AppendConflictError,
    DeadlinePassedError,
    Journal,
    UndecodableEntryError,
    UnknownSchemeError,
)
from charter.projections import ProjectionConflictError
from charter.sandbox import (
    FIRST_SANDBOX_UID,
    BwrapFds,
    HostFacts,
    compile_spec,
    render_bwrap,
)

ROOT = Path(__file__).resolve().parents[2]
ROOT_BUDGET = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=1GiB,egress=1GB")


class NamedProbe(Event):
    """A test event on a named stream."""

    type_name = "TestNamedErrorsProbe"
    name: str
    n: int

    def stream(self) -> str:
        return f"probe:{self.name}"


@pytest.fixture
def charter_app(tmp_path: Path) -> Iterator[Charter]:
    """A real Charter (journal, home, root agent ``estate``, one cell) on SQLite."""
    app, _ = Charter.initialise(
        f"sqlite:///{tmp_path / 'journal.db'}",
        root="estate",
        ceiling=Ceiling(budget=ROOT_BUDGET),
        cell=CellSetup(cores=4, reserve=0),
        keys=KeyStore(tmp_path / "home"),
    )
    with app:
        yield app


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CHARTER_DB", "CHARTER_DEBUG")}
    return subprocess.run(
        [sys.executable, "-m", "charter", *args],
        capture_output=True,
        text=True,
        cwd=home.parent,
        env={**base, "CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )


# -- core ---------------------------------------------------------------------------------


def test_key_not_found(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "home")
    with pytest.raises(KeyNotFoundError) as err:
        store.load("absent")
    assert isinstance(err.value, StateError)
    assert "CHARTER_HOME" in str(err.value)
    store.create("absent")  # control: once made, it loads
    assert len(bytes(store.load("absent"))) == 32


def test_a_missing_custody_key_stops_a_spawn(tmp_path: Path) -> None:
    """The same error where it matters: the operator's spawn needs the root's key."""
    home, db = tmp_path / "home", f"sqlite:///{tmp_path / 'journal.db'}"
    assert _cli("--db", db, "init", "--root", "estate", home=home).returncode == 0
    (home / "keys" / "agent-estate.key").unlink()
    result = _cli(
        "--db", db, "spawn", "--parent", "agent:estate", "--width", "1",
        "--objective", "scan host alpha for its open ports", "--est-cost",
        "tokens=1k,wall=1m,cpu=1m,mem=1MiB,egress=0", home=home,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr  # StateError group
    assert "no key 'agent-estate'" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_event_type_version() -> None:
    """A stored topic naming a version this Charter does not have."""
    assert event_class("JournalCreated/v1").type_name == "JournalCreated"  # control
    with pytest.raises(UnknownEventTypeError) as err:
        event_class("JournalCreated/v2")
    assert isinstance(err.value, StateError)
    with pytest.raises(UnknownEventTypeError):
        event_class("NoSuchEventAnywhere/v1")


def test_unknown_event_type_in_a_journal_read_by_the_cli(tmp_path: Path) -> None:
    """An entry written by code the reader does not have: the CLI says so (exit 1)."""
    home, db = tmp_path / "home", f"sqlite:///{tmp_path / 'journal.db'}"
    assert _cli("--db", db, "init", home=home).returncode == 0
    assert _cli("--db", db, "journal", "show", home=home).returncode == 0  # control
    with Journal.open(db) as journal:
        journal.append([NamedProbe(name="a", n=1)])
    result = _cli("--db", db, "journal", "show", home=home)
    assert result.returncode == 1, result.stderr
    assert "TestNamedErrorsProbe/v1" in result.stderr
    assert "does not know" in result.stderr
    assert "Traceback" not in result.stderr


def test_internal_error_from_a_renderer_given_the_wrong_fds() -> None:
    facts = HostFacts(
        sandbox_id="t1",
        host_uid=FIRST_SANDBOX_UID,
        host_gid=FIRST_SANDBOX_UID,
        workspace="/srv/ws",
    )
    spec = compile_spec(Budget.parse("tokens=0,wall=5s,cpu=5s,mem=64MiB,egress=0"), facts)
    assert spec.files  # the spec does carry files, so zero fds is a caller bug
    with pytest.raises(InternalError) as err:
        render_bwrap(spec, ["/bin/true"], BwrapFds(3, ()))
    assert isinstance(err.value, CharterError)
    assert not isinstance(err.value, BadInputError | StateError | RefusedError)
    assert str(err.value).startswith("internal error: ")
    assert "please report" in str(err.value)
    # Control: one fd per file renders.
    fds = BwrapFds(3, tuple(range(4, 4 + len(spec.files))))
    assert render_bwrap(spec, ["/bin/true"], fds)[-1] == "/bin/true"


# -- ledger -------------------------------------------------------------------------------


def test_unknown_scheme(tmp_path: Path) -> None:
    with pytest.raises(UnknownSchemeError) as err:
        Journal.open("mysql://root@localhost/charter")
    assert isinstance(err.value, BadInputError)
    with pytest.raises(UnknownSchemeError):
        Journal.create("file:///tmp/journal.db")
    with Journal.create(f"sqlite:///{tmp_path / 'j.db'}") as journal:  # control
        assert journal.head() is None


def test_pinned_stream_moved_is_an_append_conflict(journal_url: str) -> None:
    """A pinned stream the batch does not write to moved past the decided version: the
    recorder's PinnedStreamMovedError (under its lock) reaches callers as a conflict."""
    with Journal.create(journal_url) as journal:
        journal.append([NamedProbe(name="pinned", n=1)])
        assert journal.stream_version("probe:pinned") == 1
        head = journal.head()
        with pytest.raises(AppendConflictError) as err:
            journal.append([NamedProbe(name="other", n=1)], expect={"probe:pinned": 0})
        assert isinstance(err.value, StateError)
        assert type(err.value.__cause__).__name__ == "PinnedStreamMovedError"
        assert journal.head() == head  # nothing was written
        # Control: pinned at its real version, the same append commits.
        journal.append([NamedProbe(name="other", n=1)], expect={"probe:pinned": 1})
        assert journal.stream_version("probe:other") == 1


def test_deadline_passed(journal_url: str) -> None:
    """A batch whose decision relied on a deadline already gone: CommitPastDeadlineError
    under the recorder's lock, DeadlinePassedError to callers, nothing written."""
    with Journal.create(journal_url) as journal:
        journal.append([NamedProbe(name="d", n=0)])
        head = journal.head()
        with pytest.raises(DeadlinePassedError) as err:
            journal.append([NamedProbe(name="d", n=1)], deadline_ms=1)
        assert isinstance(err.value, StateError)
        assert type(err.value.__cause__).__name__ == "CommitPastDeadlineError"
        assert journal.head() == head
        far = 2**62  # control: a deadline far ahead
        assert len(journal.append([NamedProbe(name="d", n=1)], deadline_ms=far)) == 1


# -- audit --------------------------------------------------------------------------------


def _stamped_journal(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'chain.db'}"
    with Journal.create(url) as journal:
        journal.append([NamedProbe(name="c", n=i) for i in range(4)])
    return url


def test_chain_broken_by_a_truncated_tail(tmp_path: Path) -> None:
    url = _stamped_journal(tmp_path)
    with Journal.open(url) as journal:
        head = journal.head()
        assert head is not None
        recorded = ChainHead(position=head[0], hash=head[1].hex())
        assert verify_chain(journal, expect_head=recorded).ok  # control
        later = ChainHead(position=head[0] + 3, hash="ab" * 32)
        with pytest.raises(ChainBrokenError) as err:
            verify_chain(journal, expect_head=later)
    assert isinstance(err.value, TamperedError)
    assert err.value.report.fault is Fault.TRUNCATED
    assert err.value.report.first_bad_position == head[0] + 1


def test_chain_broken_by_a_changed_entry(tmp_path: Path) -> None:
    """An attacker with the database file drops the guard and edits one entry's state:
    verification raises ChainBrokenError (TamperedError) at that position, and the CLI
    exits 3."""
    url = _stamped_journal(tmp_path)
    path = url[len("sqlite:///") :]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER IF EXISTS stored_events_no_update")
        (state,) = conn.execute("SELECT state FROM stored_events WHERE rowid = 3").fetchone()
        forged = bytes(state).replace(b'"n":2', b'"n":9')
        assert forged != bytes(state)
        conn.execute("UPDATE stored_events SET state = ? WHERE rowid = 3", (forged,))
    finally:
        conn.close()
    with Journal.open(url) as journal, pytest.raises(ChainBrokenError) as err:
        verify_chain(journal)
    assert isinstance(err.value, TamperedError)
    report = err.value.report
    assert report.first_bad_position == 3
    assert report.fault is Fault.CHANGED
    assert report.checked == 2
    result = _cli("--db", url, "journal", "verify", home=tmp_path / "home")
    assert result.returncode == 3, result.stderr
    assert "position 3" in result.stderr


# -- budgets ------------------------------------------------------------------------------


def test_usage_for_a_lineage_with_no_lease_is_bad_input_and_not_journaled(
    charter_app: Charter,
) -> None:
    head = charter_app.journal.head()
    with pytest.raises(UnknownLeaseError, match="sa-nobody"):
        charter_app.budgets().record_usage("agent:estate/sa-nobody", Budget.zero())
    assert charter_app.journal.head() == head
    charter_app.budgets().record_usage("agent:estate", Budget.zero())  # control: it exists
    assert charter_app.journal.head() != head


def test_a_budget_refusal_is_a_member_of_its_group(charter_app: Charter) -> None:
    register_root(
        charter_app.journal, charter_app.keys, "poor", Ceiling(budget=ROOT_BUDGET),
        budget_ledger=False,
    )  # fmt: skip
    fanout = SpawnIntent(
        width=1,
        objective="scan the estate host by host",
        estimated_cost=Budget.parse("tokens=100k,wall=1m,cpu=1m,mem=1MiB,egress=0"),
    )
    with pytest.raises(BudgetRefusedError) as err:
        charter_app.spawn("agent:poor", fanout)
    assert type(err.value) is NoBudgetLedgerError
    assert isinstance(err.value, RefusedError)
    assert err.value.reason == "no-budget-ledger"
    # The group itself is never raised, only its members.
    with pytest.raises(TypeError):
        BudgetRefusedError("which one?")


# -- projections --------------------------------------------------------------------------


def test_projecting_a_position_twice_is_a_conflict(charter_app: Charter) -> None:
    """The projector refuses to record a tracking position it already holds. Under the
    projector's write lock only a degenerate chunk (0) reaches that check."""
    with charter_app.projector() as projector:
        assert projector.catch_up(stop=2) == 2
        with pytest.raises(ProjectionConflictError) as err:
            projector.catch_up(chunk=0)
        assert isinstance(err.value, StateError)
        assert projector.position() == 2  # nothing was recorded
        head = charter_app.journal.head()
        assert head is not None
        assert projector.catch_up() == head[0]  # control


def test_an_entry_that_does_not_decode_as_its_type(tmp_path: Path) -> None:
    """Bytes that name a known type but do not validate as it (altered, or from another
    version of the type): a named state error, and one line from the CLI (exit 1)."""
    home, path = tmp_path / "home", tmp_path / "journal.db"
    db = f"sqlite:///{path}"
    assert _cli("--db", db, "init", home=home).returncode == 0
    with Journal.open(db) as journal:
        assert list(journal.entries())  # control: every entry decodes
        head = journal.head()
    assert head is not None
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER stored_events_no_update")  # as an attacker would
    conn.execute(
        "UPDATE stored_events SET state = replace(state, '\"lineage\"', '\"lineagE\"') "
        "WHERE topic = 'AgentRegistered/v1'"
    )
    conn.close()
    with Journal.open(db) as journal, pytest.raises(UndecodableEntryError) as err:
        list(journal.entries())
    assert isinstance(err.value, StateError)
    result = _cli("--db", db, "journal", "show", home=home)
    assert result.returncode == 1, result.stderr
    assert "does not decode" in result.stderr
    assert "Traceback" not in result.stderr
