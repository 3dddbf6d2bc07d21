"""A cell SIGKILLed while a worker's model call is in flight: the block of tokens it drew
from was journaled before the call was sent, so the next incarnation releases the block
charging what its settled calls had not (an estimate, flagged ``recovered``) before it
returns the worker's lease: never lost, never charged twice."""

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
from charter.runner.events import (
    ModelCallSettled,
    ModelTokensHeld,
    ModelTokensReleased,
    WorkerEnded,
)
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


def _count(url: str, home: Path, kind: str) -> int:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        return sum(1 for _ in charter.journal.entries(types=(kind,)))


def _killed_mid_call(
    journal_url: str,
    home: Path,
    url: str,
    source: str,
    *args: str,
    sent: Callable[[], bool],
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
                journal_url, home, url, CALLER, json.dumps(calls),
                sent=lambda: len(server.seen) == 1,
                killed=lambda: _count(journal_url, home, "ModelTokensHeld") == 1,  # then sent
            )  # fmt: skip
        finally:
            hold.set()
        (held,) = [e.event for e in entries if isinstance(e.event, ModelTokensHeld)]
        assert not [e for e in entries if isinstance(e.event, ModelCallSettled)]
        releases = [
            (i, e.event) for i, e in enumerate(entries) if isinstance(e.event, ModelTokensReleased)
        ]
        assert len(releases) == 1, releases  # released once
        index, event = releases[0]
        # The whole block, less nothing settled: an estimate, never below what the
        # call in flight drew (the prompt's estimate and its max_tokens, 40).
        assert (event.recovered, event.charged) == (True, held.tokens)
        assert held.tokens >= 40
        charge = entries[index - 1].event
        assert isinstance(charge, UsageRecorded)
        assert charge.lineage == worker
        assert charge.amount.tokens == held.tokens
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


def test_a_block_whose_cell_died_is_charged_its_unsettled_remainder_once(
    journal_url: str, tmp_path: Path
) -> None:
    # Both calls draw from one block (no append on the second's path); the first is
    # settled exactly (its usage) before the cell dies with the second in flight. The
    # next incarnation charges the block less the first's tokens: the second's share,
    # and what no call drew, as an estimate; the first is never charged twice.
    home = tmp_path / "home"
    hold = threading.Event()
    with model_server(Behaviour(length=40, hold=hold, hold_after=2)) as (url, server):
        try:
            worker, entries = _killed_mid_call(
                journal_url, home, url, ONE_CONNECTION,
                sent=lambda: len(server.seen) == 2  # the first settled by the settler
                and _count(journal_url, home, "ModelCallSettled") == 1,
            )  # fmt: skip
        finally:
            hold.set()
    (held,) = [e.event for e in entries if isinstance(e.event, ModelTokensHeld)]
    (one,) = [e.event for e in entries if isinstance(e.event, ModelCallSettled)]
    (released,) = [e.event for e in entries if isinstance(e.event, ModelTokensReleased)]
    assert (one.how, one.estimated, one.block) == ("usage", False, held.block)
    assert (one.prompt_tokens, one.completion_tokens) == server.reported[0]
    assert released.recovered
    assert released.charged == held.tokens - sum(server.reported[0])
    usage = [e.event for e in entries if isinstance(e.event, UsageRecorded)]
    assert sum(u.amount.tokens for u in usage if u.lineage == worker) == held.tokens
    history = journal_history_of(journal_url, home)
    for check in (check_history, check_workers, check_settled, check_model_calls):
        assert check(history).problems == [], check.__name__


def journal_history_of(url: str, home: Path) -> list:
    with Charter.open(url, keys=KeyStore(home)) as charter:
        return journal_history(charter.journal)
