"""A cell SIGKILLed while a worker's model call is in flight: the reservation was
journaled before the call was sent, so the next incarnation settles it (at its whole
reservation, flagged ``recovered``) before it returns the worker's lease: never lost,
never settled twice."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from charter.app import Charter
from charter.budgets import LeaseReleased, UsageRecorded
from charter.core import KeyStore
from charter.ledger import Entry
from charter.runner.events import ModelCallReserved, ModelCallSettled, WorkerEnded
from charter.runner.model import configure_endpoint
from tests.invariants import (
    check_history,
    check_model_calls,
    check_settled,
    check_workers,
    journal_history,
)
from tests.runner._model_server import Behaviour, model_server
from tests.runner.conftest import initialise
from tests.runner.programs import PRELUDE
from tests.runner.test_crash import _cell
from tests.runner.test_model_door import CALLER, one_caller, wait_for

WT = Path(__file__).resolve().parents[2]


def _reserved(url: str, home: Path) -> list[ModelCallReserved]:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        return [
            e.event
            for e in charter.journal.entries(types=("ModelCallReserved",))
            if isinstance(e.event, ModelCallReserved)
        ]


def _killed_mid_call(
    journal_url: str,
    home: Path,
    url: str,
    sent: Callable[[], bool],
    source: str,
    *args: str,
    killed: Callable[[], bool] = lambda: True,
) -> tuple[str, list[Entry]]:
    """One worker running ``source``; its cell SIGKILLed once ``sent`` (and ``killed``
    holds then), and the next incarnation run to its end: the worker and the journal."""
    with initialise(journal_url, home) as charter:
        worker = one_caller(charter, 10_000, source, *args)
    configure_endpoint(home, url, None)
    first = _cell(journal_url, home)
    wait_for(sent, "the call reached the server", 120)
    assert killed()
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    second = _cell(journal_url, home)
    _, err = second.communicate(timeout=180)
    assert second.returncode == 0, err
    with Charter.open(journal_url, keys=KeyStore(home)) as charter:
        return worker, list(charter.journal.entries())


def test_a_call_in_flight_when_the_cell_dies_is_settled_by_the_next_one(
    journal_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    hold = threading.Event()
    calls = [{"content": "think hard", "stream": True, "include_usage": True, "max_tokens": 40}]
    with model_server(Behaviour(length=40, hold=hold, hold_after=2)) as (url, server):
        try:
            worker, entries = _killed_mid_call(
                journal_url, home, url, lambda: len(server.seen) == 1, CALLER, json.dumps(calls),
                killed=lambda: len(_reserved(journal_url, home)) == 1,  # before it was sent
            )  # fmt: skip
        finally:
            hold.set()
        (reserved,) = [e.event for e in entries if isinstance(e.event, ModelCallReserved)]
        settled = [
            (i, e.event) for i, e in enumerate(entries) if isinstance(e.event, ModelCallSettled)
        ]
        assert len(settled) == 1, settled  # settled once
        index, event = settled[0]
        assert (event.how, event.estimated) == ("recovered", True)
        assert (event.prompt_tokens, event.completion_tokens) == (
            reserved.prompt_estimate, reserved.max_tokens,
        )  # fmt: skip
        charge = entries[index - 1].event
        assert isinstance(charge, UsageRecorded)
        assert charge.lineage == worker
        assert charge.amount.tokens == reserved.reserved
        released = [
            i for i, e in enumerate(entries)
            if isinstance(e.event, LeaseReleased) and e.event.lineage == worker
        ]  # fmt: skip
        assert released
        assert index < released[0]
        (end,) = [e.event for e in entries if isinstance(e.event, WorkerEnded)]
        assert end.outcome == "lost"  # failed by the next incarnation
        history = journal_history_of(journal_url, home)
        for check in (check_history, check_workers, check_settled, check_model_calls):
            assert check(history).problems == [], check.__name__


# Two calls on one kept-alive connection: the first answered whole, the second streamed.
ONE_CONNECTION = (
    PRELUDE
    + """
conn = charter_door.ModelConnection(timeout=300)
for body in ({"model": "m", "messages": [{"role": "user", "content": "one two"}],
              "max_tokens": 5},
             {"model": "m", "messages": [{"role": "user", "content": "three"}],
              "max_tokens": 40, "stream": True}):
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    conn.getresponse().read()
charter_door.Door().result("done")
"""
)


def test_a_settlement_carried_by_the_next_reservation_survives_the_cells_death(
    journal_url: str, tmp_path: Path
) -> None:
    # The first call's settlement rides in the second's reservation, which commits
    # before the second is sent: once the second reached the server, the first is on
    # record exactly (its usage), whatever happens next. The cell dies with the second
    # in flight; the next incarnation recovers only that one.
    home = tmp_path / "home"
    hold = threading.Event()
    with model_server(Behaviour(length=40, hold=hold, hold_after=2)) as (url, server):
        try:
            worker, entries = _killed_mid_call(
                journal_url, home, url, lambda: len(server.seen) == 2, ONE_CONNECTION
            )
        finally:
            hold.set()
    reserved = [e for e in entries if isinstance(e.event, ModelCallReserved)]
    settled = {e.event.call: e for e in entries if isinstance(e.event, ModelCallSettled)}
    assert len(reserved) == 2
    one, two = (settled[r.event.call] for r in reserved)
    assert one.batch == reserved[1].batch  # in the second's reservation's append
    assert (one.event.how, one.event.estimated) == ("usage", False)
    assert (one.event.prompt_tokens, one.event.completion_tokens) == server.reported[0]
    assert (two.event.how, two.event.estimated) == ("recovered", True)
    usage = [e.event for e in entries if isinstance(e.event, UsageRecorded)]
    assert sum(u.amount.tokens for u in usage if u.lineage == worker) == (
        sum(server.reported[0]) + reserved[1].event.reserved
    )
    history = journal_history_of(journal_url, home)
    for check in (check_history, check_workers, check_settled, check_model_calls):
        assert check(history).problems == [], check.__name__


def journal_history_of(url: str, home: Path) -> list:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        return journal_history(charter.journal)
