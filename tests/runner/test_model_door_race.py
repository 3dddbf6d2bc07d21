"""A model hold and a spawn of the same lease, each deciding on the book before the
other commits (docs/model-door.md): the hold is on the lease's stream, pinned to the
version it read, like the fan-out, so whichever commits second conflicts and is decided
again seeing the first. The interleavings are forced inside the decisions (a hook run
once the book was read), no sleeps; each beside a positive control."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from charter.app import Charter
from charter.budgets import InsufficientBudgetError, LeaseBook, LeaseGranted, UsageRecorded
from charter.control import append_pinned
from charter.runner.errors import ModelTokensError
from charter.runner.events import (
    ModelCallSettled,
    ModelTokensHeld,
    ModelTokensReleased,
    model_block_stream,
)
from charter.runner.model import BLOCK_CALLS, ChatRequest, Draw, ModelMeter, Settlement
from tests.invariants import check_model_calls, journal_history
from tests.runner.conftest import initialise
from tests.runner.test_model_door import model_cell, spawning_caller

LEASE = 400
CALL = ChatRequest.parse(b'{"messages": [], "max_tokens": 9}')
"""A call reserving 18 (34 bytes / 4, rounded up, + 9): a block of 8 of them, 144."""
BLOCK = BLOCK_CALLS * 18


@contextlib.contextmanager
def _lease(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> Iterator[tuple[Charter, str, ModelMeter, Callable[[int], None]]]:
    """A worker's lease of :data:`LEASE` tokens that may fan out, a meter of a cell, and
    a spawn below the worker carving ``tokens`` of it."""
    with initialise(journal_url, tmp_path / "home") as charter:
        worker, spawn = spawning_caller(charter, LEASE)
        yield charter, worker, ModelMeter(model_cell(charter, state_dir, None)), spawn


def _of(charter: Charter, kind: type[Any]) -> list[Any]:
    return [e.event for e in charter.journal.entries() if isinstance(e.event, kind)]


def _carved(charter: Charter, worker: str) -> int:
    """What the lease's holds, children and spend took, as journaled (each hold whole)."""
    holds = sum(h.tokens for h in _of(charter, ModelTokensHeld) if h.lineage == worker)
    children = sum(
        g.allocation.tokens * len(g.lineages)
        for g in _of(charter, LeaseGranted)
        if g.parent == worker
    )
    spent = sum(u.amount.tokens for u in _of(charter, UsageRecorded) if u.lineage == worker)
    total: int = holds + children + spent
    return total


def _settle_and_check(charter: Charter, worker: str, meter: ModelMeter, draws: list[Draw]) -> None:
    for draw in draws:
        settled = Settlement.of(draw, 9, 9, estimated=False, how="usage", status=200, latency_ms=1)
        assert meter.settle(settled) is not None
    meter.finish(worker)
    usage = [u for u in _of(charter, UsageRecorded) if u.lineage == worker]
    assert sum(u.refused.tokens for u in usage) == 0, "tokens spent that no lease covers"
    assert charter.budgets().remaining(worker).tokens >= 0
    assert check_model_calls(journal_history(charter.journal)).problems == []


def _spawn_inside_the_hold(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> list[int]:
    """Run ``act`` once, inside the hold's first pinned decision (the book read, the
    append not made); the count of the hold's decisions."""
    real = append_pinned
    decisions: list[int] = []

    def hooked(journal: Any, shared: Any, streams: Any, decide: Any, **kw: Any) -> Any:
        def hooked_decide(versions: dict[str, int]) -> Any:
            decisions.append(1)
            decided = decide(versions)
            if len(decisions) == 1:
                act()  # commits before the hold's append
            return decided

        return real(journal, shared, streams, hooked_decide, **kw)

    monkeypatch.setattr("charter.runner.model.append_pinned", hooked)
    return decisions


@pytest.mark.parametrize("spared", [0, 50])
def test_a_spawn_committed_after_a_hold_was_decided_makes_it_decided_again(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch, spared: int
) -> None:
    # The hold reads 400 left and decides a block of 144; before it commits, a spawn
    # carves all of the 400 but ``spared``. The hold's append conflicts at its pin on
    # the lease's stream, and decided again it is refused (nothing spared) or smaller
    # (50 spared: a block of 50).
    with _lease(journal_url, tmp_path, state_dir) as (charter, worker, meter, spawn):
        decisions = _spawn_inside_the_hold(monkeypatch, lambda: spawn(LEASE - spared))
        draws = []
        if spared == 0:
            with pytest.raises(ModelTokensError):
                meter.reserve(worker, CALL)
        else:
            draw = meter.reserve(worker, CALL)
            assert draw.block.tokens == spared < BLOCK
            draws.append(draw)
        assert len(decisions) == 2, "the hold was not decided again"
        assert _carved(charter, worker) <= LEASE
        _settle_and_check(charter, worker, meter, draws)


def test_a_hold_and_a_spawn_that_both_fit_both_commit(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The positive control of the interleaving: the spawn leaves room for the block,
    # so the hold, decided again, holds its whole block.
    with _lease(journal_url, tmp_path, state_dir) as (charter, worker, meter, spawn):
        decisions = _spawn_inside_the_hold(monkeypatch, lambda: spawn(LEASE - BLOCK))
        draw = meter.reserve(worker, CALL)
        assert draw.block.tokens == BLOCK
        assert len(decisions) == 2
        assert _carved(charter, worker) == LEASE
        _settle_and_check(charter, worker, meter, [draw])


@pytest.mark.parametrize("carve", [LEASE, LEASE - BLOCK])
def test_a_hold_committed_after_a_spawn_was_decided_makes_it_decided_again(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch, carve: int
) -> None:
    # The spawn reads 400 left and decides to carve ``carve``; before it commits, the
    # worker's call holds a block of 144. The spawn's append conflicts at its pin on the
    # lease's stream (the hold moved it) and, decided again, sees the hold: carving all
    # 400 it is refused; carving what the block leaves (the positive control), it
    # commits.
    with _lease(journal_url, tmp_path, state_dir) as (charter, worker, meter, spawn):
        real = LeaseBook.decide_leases
        draws: list[Draw] = []
        decided: list[bool] = []  # a decision of the worker's fan-out, each

        def hooked(book: LeaseBook, parent: str, *args: Any, **kw: Any) -> Any:
            decided.append(parent == worker)
            leases = real(book, parent, *args, **kw)  # the second time, refused or not
            if sum(decided) == 1 and decided[-1]:
                draws.append(meter.reserve(worker, CALL))  # commits before the spawn
            return leases

        monkeypatch.setattr(LeaseBook, "decide_leases", hooked)
        if carve > LEASE - BLOCK:
            with pytest.raises(InsufficientBudgetError):
                spawn(carve)
        else:
            spawn(carve)
        assert sum(decided) == 2, "the spawn was not decided again"
        assert draws[0].block.tokens == BLOCK
        assert _carved(charter, worker) == (LEASE if carve == LEASE - BLOCK else BLOCK)
        _settle_and_check(charter, worker, meter, draws)


@pytest.mark.parametrize("settled", [False, True])
def test_a_block_an_older_door_held_on_its_own_stream_is_recovered(
    journal_url: str,
    tmp_path: Path,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    settled: bool,
) -> None:
    # An older door journaled a hold as its block's stream's first entry (its calls'
    # settlements after it): the next incarnation's recovery pins that stream where
    # those entries left it, and charges the block less what its calls settled.
    with _lease(journal_url, tmp_path, state_dir) as (charter, worker, meter, _spawn):
        with monkeypatch.context() as older:
            older.setattr(ModelTokensHeld, "stream", lambda h: model_block_stream(h.block))
            draw = meter.reserve(worker, CALL)
        draw.block.version = 1  # the older door's count: its hold, on the block's stream
        if settled:
            usage = Settlement.of(
                draw, 9, 9, estimated=False, how="usage", status=200, latency_ms=1
            )
            assert meter.settle(usage) is not None
        later = ModelMeter(model_cell(charter, state_dir, None))  # the next incarnation
        assert later.recover(worker) == 1
        (release,) = _of(charter, ModelTokensReleased)
        assert (release.recovered, release.charged) == (True, BLOCK - 18 * settled)
        assert charter.budgets().remaining(worker).tokens == LEASE - BLOCK
        assert check_model_calls(journal_history(charter.journal)).problems == []


def test_a_settlement_a_hold_overtook_is_decided_again_and_charged_once(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A settlement's charge is decided on the book; before it commits, a hold of the
    # same lease (another meter's: this one's own holds wait for its settler) moves the
    # lease's stream. The settlement's append conflicts at its pin on that stream and
    # is decided again: committed once, charged once, nothing dropped.
    with _lease(journal_url, tmp_path, state_dir) as (charter, worker, meter, _spawn):
        draw = meter.reserve(worker, CALL)
        other = ModelMeter(model_cell(charter, state_dir, None))
        real = LeaseBook.decide_usage
        decided: list[bool] = []  # a decision of the worker's usage, each
        overtaking: list[Draw] = []

        def hooked(book: LeaseBook, lineage: str, *args: Any, **kw: Any) -> Any:
            decided.append(lineage == worker)
            usage = real(book, lineage, *args, **kw)
            if lineage == worker and not overtaking:
                overtaking.append(other.reserve(worker, CALL))  # commits before it
            return usage

        monkeypatch.setattr(LeaseBook, "decide_usage", hooked)
        usage = Settlement.of(draw, 9, 9, estimated=False, how="usage", status=200, latency_ms=1)
        assert meter.settle(usage) is not None
        assert sum(decided) >= 2, "the settlement was not decided again"
        monkeypatch.undo()
        assert overtaking[0].block.tokens == BLOCK
        charged = [u for u in _of(charter, UsageRecorded) if u.lineage == worker]
        assert sum(u.amount.tokens for u in charged) == 18
        assert [s.call for s in _of(charter, ModelCallSettled)] == [draw.call]
        assert _carved(charter, worker) <= LEASE
        meter.finish(worker)
        _settle_and_check(charter, worker, other, overtaking)
