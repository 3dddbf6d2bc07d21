"""The model door's meter (docs/model-door.md, ``charter/runner/model.py``) as an audit
rule (``model-call``, docs/VERIFYING.md §9): a reservation past the lease's tokens net
of its calls in flight, or on a lease that is not live, or reserved twice; a settlement
of a call never reserved, settled twice, for another lineage, or not charging its tokens
in its append; an estimate not flagged so or past its reservation; a block of tokens held
past the lease net of what is held, a drawn call settled twice, past its block or on no
block its lineage holds, and a block released twice or recovered not charging its
unsettled remainder in its append. Each beside a
positive control: the same calls reserved and settled as the meter does it are clean.
Entries appended past the control layer, validly chained, as an attacker with write
access would. SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import charter.catalogue  # noqa: F401  (registers every event type)
from charter.budgets import BudgetRefused, LeaseGranted
from charter.core import Budget
from charter.runner.events import (
    ModelCallReserved,
    ModelCallSettled,
    ModelTokensHeld,
    ModelTokensReleased,
)
from tests.audit.test_semantic import _append, _audit, _event, _only, _usage, made

__all__ = ["made"]


def _tokens(n: int) -> Budget:
    return Budget(tokens=n, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)


def _reserve(lineage: str, need: int, estimate: int | None = None) -> ModelCallReserved:
    estimate = min(10, need - 1) if estimate is None else estimate
    return ModelCallReserved(
        call=uuid.uuid4().hex,
        lineage=lineage,
        cell="local",
        model="m",
        digest="0" * 64,
        stream_response=False,
        prompt_estimate=estimate,
        max_tokens=need - estimate,
        reserved=need,
    )


def _settled(r: ModelCallReserved, prompt: int, completion: int, **kw: Any) -> ModelCallSettled:
    fields: dict[str, Any] = {"estimated": False, "how": "usage"} | kw
    return ModelCallSettled(
        call=r.call,
        lineage=r.lineage,
        prompt_tokens=prompt,
        completion_tokens=completion,
        status=200,
        latency_ms=1,
        **fields,
    )


def _settle(r: ModelCallReserved, prompt: int, completion: int) -> tuple[Any, ...]:
    """As the meter settles: the usage and the settlement in one append."""
    return (_usage(r.lineage, _tokens(prompt + completion)), _settled(r, prompt, completion))


def _allocation(url: str, lineage: str) -> int:
    granted = _event(url, "LeaseGranted")
    with_it = [lineage] if lineage in granted.lineages else []
    assert with_it, "the first fan-out's lease names the lineage"
    return int(granted.allocation.tokens)


def test_reservations_stay_within_the_lease_net_of_calls_in_flight(made: tuple) -> None:
    url, _, lineages = made
    worker = lineages[2]  # a worker with no children: its lease's tokens all its own
    tokens = _allocation(url, worker)
    _append(url, _usage(worker, _tokens(1000)))
    half = (tokens - 1000) // 2
    first, second = _reserve(worker, half), _reserve(worker, tokens - 1000 - half)
    _append(url, first)
    _append(url, second)  # both in flight: exactly the lease's tokens left
    assert _audit(url).ok  # positive control: up to the very token
    (over,) = _append(url, _reserve(worker, 1))  # one token more while both are in flight
    _append(url, *_settle(first, 5, 5))  # the first settles: its reservation is given back
    _append(url, _reserve(worker, half - 10 - 1))  # fits again (10 tokens were charged)
    report = _audit(url)
    assert _only(report, "model-call") == [over]
    assert {f.position for f in report.findings} == {over}
    assert "over its allocation" in report.findings[0].detail


def test_a_reservation_on_an_ended_lease_or_reserved_twice_is_found(made: tuple) -> None:
    url, _, lineages = made
    r = _reserve(lineages[1], 100)
    _append(url, r)
    assert _audit(url).ok  # positive control
    (twice,) = _append(url, r)
    (nobody,) = _append(url, _reserve("agent:estate/nobody", 100))
    assert _only(_audit(url), "model-call") == [twice, nobody]


def test_a_settlement_comes_once_after_its_reservation_in_its_usages_append(made: tuple) -> None:
    url, _, lineages = made
    worker = lineages[0]
    a, b, c, d = (_reserve(worker, 100) for _ in range(4))
    _append(url, a, b, c, d)
    _append(url, *_settle(a, 20, 30))
    _append(url, _usage(worker, _tokens(0)), BudgetRefused(
        lineage=worker, operation="usage", reason="lease-ended", message="ended"
    ))  # fmt: skip
    _append(url, _settled(b, 20, 30))  # the lease ended first: settled alone, after it
    _append(
        url, _usage(worker, _tokens(100)), _settled(c, 10, 90, estimated=True, how="cut-at-cap")
    )
    assert _audit(url).ok  # positive control: the meter's three ways to settle
    (again,) = _append(url, *_settle(a, 20, 30))[1:]
    (unreserved,) = _append(url, *_settle(_reserve(worker, 100), 1, 1))[1:]
    (alone,) = _append(url, _settled(d, 20, 30))  # no usage in its append
    e = _reserve(worker, 100)
    _append(url, e)
    (short,) = _append(url, _usage(worker, _tokens(1)), _settled(e, 20, 30))[1:]  # 1 ≠ 50
    f = _reserve(worker, 100)
    _append(url, f)
    _append(url, _usage(worker, _tokens(50)))
    (split,) = _append(url, _settled(f, 20, 30))  # its usage, but in another append
    report = _audit(url)
    assert _only(report, "model-call") == [again, unreserved, alone, short, split]
    assert {f.check for f in report.findings} == {"model-call"}


def test_an_estimate_is_flagged_and_within_its_reservation(made: tuple) -> None:
    url, _, lineages = made
    worker = lineages[2]
    a, b, c = (_reserve(worker, 100, estimate=10) for _ in range(3))
    _append(url, a, b, c)
    _append(url, _usage(worker, _tokens(100)), _settled(a, 10, 90, estimated=True, how="recovered"))
    assert _audit(url).ok  # positive control: a recovery settles at the whole reservation
    (past,) = _append(url, _usage(worker, _tokens(101)), _settled(
        b, 10, 91, estimated=True, how="client-gone"
    ))[1:]  # fmt: skip
    (unflagged,) = _append(url, _usage(worker, _tokens(5)), _settled(c, 2, 3, how="no-usage"))[1:]
    assert _only(_audit(url), "model-call") == [past, unflagged]


# -- blocks of tokens (the door's reservations since blocks) -----------------------


def _hold(lineage: str, tokens: int) -> ModelTokensHeld:
    return ModelTokensHeld(block=uuid.uuid4().hex, lineage=lineage, cell="local", tokens=tokens)


def _drawn(
    block: ModelTokensHeld, prompt: int, completion: int, need: int = 100, **kw: Any
) -> ModelCallSettled:
    fields: dict[str, Any] = {"estimated": False, "how": "usage"} | kw
    return ModelCallSettled(
        call=uuid.uuid4().hex, lineage=block.lineage, block=block.block, model="m",
        digest="0" * 64, stream_response=False, prompt_estimate=10, max_tokens=need - 10,
        reserved=need, prompt_tokens=prompt, completion_tokens=completion, status=200,
        latency_ms=1, **fields,
    )  # fmt: skip


def _released(block: ModelTokensHeld, charged: int = 0, **kw: Any) -> ModelTokensReleased:
    return ModelTokensReleased(
        block=block.block, lineage=block.lineage, charged=charged,
        recovered=kw.get("recovered", False),
    )  # fmt: skip


def test_a_block_is_held_within_the_lease_net_of_what_is_held(made: tuple) -> None:
    url, _, lineages = made
    worker = lineages[2]  # a worker with no children: its lease's tokens all its own
    tokens = _allocation(url, worker)
    first = _hold(worker, tokens // 2)
    _append(url, first)
    _append(url, _hold(worker, tokens - tokens // 2))  # exactly the lease's tokens held
    assert _audit(url).ok  # positive control: up to the very token
    (over,) = _append(url, _hold(worker, 1))
    call = _drawn(first, 20, 30)
    _append(url, _usage(worker, _tokens(50)), call)  # its charge is the lease's, not held twice
    (still,) = _append(url, _hold(worker, 1))  # still full: charged 50, held the rest
    _append(url, _released(first))  # its hold ends
    _append(url, _hold(worker, tokens // 2 - 50 - 2))  # fits again (the two found still held)
    report = _audit(url)
    assert _only(report, "model-call") == [over, still]


def test_a_fan_out_carving_the_tokens_a_block_holds_is_found(made: tuple) -> None:
    # The lease book counts a block's tokens (less its settled calls' charges) against
    # its lease until released, so a spawn cannot lease them out: a forged fan-out that
    # does is found; one within what is left beside the block (the positive control),
    # and one after the block's release, are not.
    url, _, lineages = made
    worker = lineages[2]  # a worker with no children: its lease's tokens all its own
    tokens = _allocation(url, worker)
    granted = _event(url, "LeaseGranted")
    block = _hold(worker, tokens // 2)
    _append(url, block)
    _append(url, _usage(worker, _tokens(50)), _drawn(block, 20, 30))

    def carve(n: int, tokens_: int) -> LeaseGranted:
        allocation = Budget(tokens=tokens_, wall_ms=1, cpu_ms=1, mem_bytes=1, egress_bytes=0)
        return LeaseGranted(
            parent=worker, lineages=(f"{worker}/sa-{n}",), allocation=allocation,
            expires_at_ms=granted.expires_at_ms,
        )  # fmt: skip

    # Left beside the block: its tokens less the 50 charged (held), and the 50 (spent).
    _append(url, carve(901, tokens - tokens // 2 - 1))  # one token to spare
    control = _audit(url)
    assert _only(control, "model-call") == [], control.findings  # positive control
    (over,) = _append(url, carve(902, 2))  # one token of the block's
    _append(url, _released(block))
    _append(url, carve(903, 1))  # the block released: its unspent tokens are free again
    report = _audit(url)
    assert _only(report, "model-call") == [over]
    assert any("over its allocation" in f.detail for f in report.findings if f.position == over)


def test_a_drawn_call_settles_once_on_a_block_its_lineage_holds(made: tuple) -> None:
    url, _, lineages = made
    worker, other = lineages[0], lineages[1]
    block = _hold(worker, 400)
    _append(url, block)
    call = _drawn(block, 20, 30)
    _append(url, _usage(worker, _tokens(50)), call)
    _append(
        url, _usage(worker, _tokens(100)), _drawn(block, 10, 90, estimated=True, how="no-usage")
    )
    assert _audit(url).ok  # positive control
    (again,) = _append(url, _usage(worker, _tokens(50)), call)[1:]
    (wide,) = _append(url, _usage(worker, _tokens(5)), _drawn(block, 2, 3, need=401))[1:]
    theirs = _hold(other, 100)
    _append(url, theirs)
    (foreign,) = _append(url, _usage(worker, _tokens(5)), _drawn(theirs, 2, 3).model_copy(
        update={"lineage": worker}
    ))[1:]  # fmt: skip
    (uncharged,) = _append(url, _drawn(block, 2, 3))
    _append(url, _released(block))
    (after,) = _append(url, _usage(worker, _tokens(5)), _drawn(block, 2, 3))[1:]
    assert _only(_audit(url), "model-call") == [again, wide, foreign, uncharged, after]


def test_a_block_is_released_once_a_recovered_one_charging_its_remainder(made: tuple) -> None:
    url, _, lineages = made
    worker = lineages[0]
    a, b, c = _hold(worker, 300), _hold(worker, 300), _hold(worker, 300)
    _append(url, a, b, c)
    _append(url, _usage(worker, _tokens(50)), _drawn(a, 20, 30))
    _append(url, _usage(worker, _tokens(250)), _released(a, 250, recovered=True))
    assert _audit(url).ok  # positive control: the block less its settled call
    (twice,) = _append(url, _released(a))
    (off,) = _append(url, _usage(worker, _tokens(299)), _released(b, 299, recovered=True))[1:]
    (alone,) = _append(url, _released(c, 300, recovered=True))  # no usage in its append
    assert _only(_audit(url), "model-call") == [twice, off, alone]


def test_a_settlement_after_a_refusal_of_another_operation_is_not_charged(made: tuple) -> None:
    # A settlement journaled alone passes after its lease's refusal of a usage (the
    # lease ended: nothing could be charged), never after a refusal of anything else
    # (a spawn the live lease could not pay for): that one is a call left uncharged.
    url, _, lineages = made
    worker = lineages[0]
    a, b = _reserve(worker, 100), _reserve(worker, 100)
    _append(url, a, b)
    _append(url, _usage(worker, _tokens(0)), BudgetRefused(
        lineage=worker, operation="usage", reason="lease-ended", message="ended"
    ))  # fmt: skip
    _append(url, _settled(a, 20, 30))
    assert _audit(url).ok  # positive control: after a refusal of its usage
    _append(url, BudgetRefused(
        lineage=worker, operation="spawn", reason="over-budget", message="too much"
    ))  # fmt: skip
    (uncharged,) = _append(url, _settled(b, 20, 30))
    assert _only(_audit(url), "model-call") == [uncharged]
