"""An allowed egress connection is committed to the journal (``EgressOpened``) before the
broker opens it, and if that append fails the connection is refused: nothing takes
effect before its event is committed. Real sandboxes, a real SQLite journal."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from charter.core import Budget
from charter.core.events import Event
from charter.ledger import Journal
from charter.ledger.errors import AppendFailedError
from charter.sandbox import EgressBroker, EgressGrant, EgressOpened, Launcher

from ._egress_support import CLIENT, PAYLOAD, Server
from ._support import out, sandboxed

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=10MB")


def _opened_in(url: str) -> list[str]:
    """The addresses of the EgressOpened entries committed to the journal at ``url``,
    read through a connection of its own."""
    with Journal.open(url) as journal:
        return [e.event.address for e in journal.entries(types=("EgressOpened",))]  # type: ignore[attr-defined]


def test_an_allowed_connection_is_committed_before_it_opens(
    journal_url: str, state_dir: Path
) -> None:
    url = journal_url  # SQLite and PostgreSQL: the append runs on a broker thread
    seen_at_accept: list[list[str]] = []
    server = Server(on_accept=lambda: seen_at_accept.append(_opened_in(url)))
    try:
        with (
            Journal.create(url) as journal,
            EgressBroker(state_dir / "egress-journal.sock") as broker,
        ):
            launcher = Launcher(journal, state_dir=state_dir, egress=broker)
            target = f"127.0.0.1:{server.port}"
            o = sandboxed(launcher, B, CLIENT, target, grant=EgressGrant(destinations=(target,)))
            entries = [
                e for e in journal.entries() if getattr(e.event, "sandbox_id", None) == o.sandbox_id
            ]
        assert out(o).split() == ["200", str(PAYLOAD)]
        # When the server accepted, the entry was already committed (read independently).
        assert seen_at_accept == [["127.0.0.1"]]
        kinds = [e.type_name for e in entries]
        assert kinds.index("SandboxLeased") < kinds.index("EgressOpened")
        assert kinds.index("EgressOpened") < kinds.index("SandboxExited")
        (opened,) = [e.event for e in entries if isinstance(e.event, EgressOpened)]
        assert (opened.destination, opened.address) == (target, "127.0.0.1")
    finally:
        server.close()


class _RefusingEgress:
    """A real journal whose appends of EgressOpened fail as a real append fails (nothing
    written); ``refuse`` off, it is the journal unchanged."""

    def __init__(self, journal: Journal, *, refuse: bool) -> None:
        self.journal, self.refuse = journal, refuse

    def append(self, events: Sequence[Event]) -> object:
        if self.refuse and any(isinstance(e, EgressOpened) for e in events):
            raise AppendFailedError("journal append failed, nothing written")
        return self.journal.append(events)


def test_a_connection_whose_append_fails_is_not_opened(tmp_path: Path, state_dir: Path) -> None:
    server = Server()
    target = f"127.0.0.1:{server.port}"
    grant = EgressGrant(destinations=(target,))
    try:
        with (
            Journal.create(f"sqlite:///{tmp_path}/journal.db") as journal,
            EgressBroker(state_dir / "egress-nojournal.sock") as broker,
        ):
            failing = Launcher(
                _RefusingEgress(journal, refuse=True), state_dir=state_dir, egress=broker
            )
            refused = sandboxed(failing, B, CLIENT, target, grant=grant)
            assert out(refused).split() == ["503", "0"]
            assert server.accepted == 0  # nothing was opened
            attempts = [
                (e.event.reason, e.event.allowed)  # type: ignore[attr-defined]
                for e in journal.entries(types=("EgressAttempted",))
            ]
            assert attempts == [("journal append failed", False)]
            # Control: the same journal committing, the same connection opens.
            working = Launcher(
                _RefusingEgress(journal, refuse=False), state_dir=state_dir, egress=broker
            )
            allowed = sandboxed(working, B, CLIENT, target, grant=grant)
            assert out(allowed).split() == ["200", str(PAYLOAD)]
            assert server.accepted == 1
    finally:
        server.close()
