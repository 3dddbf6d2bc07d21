"""Tokens held for calls (charter/budgets/holds.py) in the lease book: a hold counts
against its lease's remainder (what a fan-out may carve) until released, less what the
calls settled on it charged, so a settled call is counted once; a charge settled on a
hold draws from it. Each refusal beside a positive control."""

from __future__ import annotations

import uuid

import pytest

import charter.catalogue  # noqa: F401  (registers every event type)
from charter.budgets import (
    HOLD_TYPES,
    BudgetLedgerOpened,
    HeldTokensCharged,
    HeldTokensReleased,
    InsufficientBudgetError,
    LeaseBook,
    TokensHeld,
)
from charter.core import Budget
from charter.core.events import event_types
from charter.runner.events import ModelCallSettled, ModelTokensHeld, ModelTokensReleased

ROOT = "agent:root"


def _tokens(n: int) -> Budget:
    return Budget(tokens=n, wall_ms=1000, cpu_ms=1000, mem_bytes=1, egress_bytes=0)


def _settled(block: str, tokens: int) -> ModelCallSettled:
    return ModelCallSettled(
        call=uuid.uuid4().hex, lineage=ROOT, block=block, model="m", digest="0" * 64,
        stream_response=False, prompt_estimate=10, max_tokens=90, reserved=100,
        prompt_tokens=10, completion_tokens=tokens - 10, estimated=False, how="usage",
        status=200, latency_ms=1,
    )  # fmt: skip


def test_the_hold_types_are_exactly_the_events_the_book_folds_as_holds() -> None:
    bases = (TokensHeld, HeldTokensCharged, HeldTokensReleased)
    named = {name for name, cls in event_types().items() if issubclass(cls, bases)}
    assert named == set(HOLD_TYPES)


def test_a_hold_counts_against_the_remainder_until_released_each_call_once() -> None:
    book = LeaseBook()
    book.apply(BudgetLedgerOpened(lineage=ROOT, allocation=_tokens(1000)), 0)
    held = ModelTokensHeld(block=uuid.uuid4().hex, lineage=ROOT, cell="c", tokens=300)
    book.apply(held, 1)
    assert book.remaining(ROOT, 2).tokens == 700
    assert book.held(ROOT) == book.held(ROOT, [held.block]) == 300
    with pytest.raises(InsufficientBudgetError):  # one token of the hold's
        book.decide_leases(ROOT, [(f"{ROOT}/sa-1", _tokens(701), 10_000, "")], 2)
    book.decide_leases(ROOT, [(f"{ROOT}/sa-1", _tokens(700), 10_000, "")], 2)  # control
    # A call settled on the hold: its usage may draw from the hold (the lease's
    # remainder alone is less than it), and is counted once, as spent.
    usage = book.decide_usage(ROOT, _tokens(50), 3, available=_tokens(0), holds=[held.block])
    assert (usage.amount.tokens, usage.refused.tokens) == (50, 0)
    assert book.decide_usage(ROOT, _tokens(50), 3, available=_tokens(0)).refused.tokens == 50
    book.apply(usage, 3)
    book.apply(_settled(held.block, 50), 3)
    assert book.held(ROOT) == 250
    assert book.remaining(ROOT, 4).tokens == 1000 - 50 - 250
    book.apply(ModelTokensReleased(block=held.block, lineage=ROOT, charged=0, recovered=False), 5)
    assert book.held(ROOT) == 0
    assert book.remaining(ROOT, 6).tokens == 950
