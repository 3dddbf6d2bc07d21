"""`charter model configure|show`: the one place the model endpoint and its key are kept
(the home, mode 0600), never shown, read by the cell's door."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from charter.app import Charter
from charter.budgets import InsufficientBudgetError, UsageRecorded
from charter.core import BadInputError, Event
from charter.ledger.errors import AppendFailedError
from charter.runner.errors import ModelRequestError, ModelTokensError
from charter.runner.events import ModelCallSettled, ModelTokensHeld, ModelTokensReleased
from charter.runner.model import (
    BLOCK_CALLS,
    ChatRequest,
    Draw,
    ModelDoor,
    ModelEndpoint,
    ModelMeter,
    Settlement,
    load_endpoint,
    prompt_estimate,
)
from tests.invariants import check_model_calls, journal_history
from tests.runner._model_server import model_server
from tests.runner.conftest import initialise
from tests.runner.programs import python
from tests.runner.test_model_door import model_cell, spawn_callers, spawning_caller

E = TypeVar("E", bound=Event)


def charter_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHARTER_HOME": str(home), "PYTHONPATH": os.getcwd()}
    return subprocess.run(
        [sys.executable, "-m", "charter", *args], env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip


def test_configure_keeps_the_key_in_the_home_and_never_shows_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    key = tmp_path / "key"
    key.write_text("sk-secret-value\n")
    done = charter_cli(home, "--json", "model", "configure", "--url", "http://127.0.0.1:9/v1",
                       "--key-file", str(key))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "sk-secret-value" not in done.stdout
    held = home / "model-api-key"
    assert stat.S_IMODE(held.stat().st_mode) == 0o600
    shown = charter_cli(home, "--json", "model", "show")
    assert json.loads(shown.stdout) == {"url": "http://127.0.0.1:9/v1", "key": True}
    assert "sk-secret" not in shown.stdout + shown.stderr
    endpoint = load_endpoint(home)
    assert endpoint == ModelEndpoint("http://127.0.0.1:9/v1", "sk-secret-value")
    assert "sk-secret" not in repr(endpoint)
    # Not an http(s) URL: refused before anything is written (exit 2).
    bad = charter_cli(home, "model", "configure", "--url", "file:///etc/passwd")
    assert bad.returncode == 2, bad.stderr
    assert load_endpoint(home) == endpoint


def test_an_endpoint_is_an_http_url_with_a_host() -> None:
    with pytest.raises(BadInputError):
        ModelEndpoint("ftp://example.com/v1")


def test_the_prompt_estimate_is_the_body_bytes_over_four_rounded_up() -> None:
    assert [prompt_estimate(b"x" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_a_malformed_call_is_bad_input() -> None:
    bodies = (
        b"not json",
        b"[]",
        b'{"messages": "x"}',
        b'{"messages": [], "max_tokens": 0}',
        b'{"messages": [], "max_tokens": true}',
        b'{"messages": [], "stream": 1}',
    )
    for body in bodies:
        with pytest.raises(ModelRequestError):
            ChatRequest.parse(body)


CALL = ChatRequest.parse(b'{"messages": [], "max_tokens": 9}')
"""A call reserving 18: 34 bytes / 4, rounded up, + 9."""


@contextlib.contextmanager
def _metered(
    journal_url: str, tmp_path: Path, tokens: int, state_dir: Path
) -> Iterator[tuple[Charter, str, ModelMeter]]:
    """A journal, one worker spawned in it with ``tokens``, and a meter of a cell."""
    with initialise(journal_url, tmp_path / "home") as charter:
        (worker,) = (str(c.lineage) for c in spawn_callers(charter, tokens, python("")).children)
        yield charter, worker, ModelMeter(model_cell(charter, state_dir, None))


def _usage(draw: Draw, prompt: int, completion: int) -> Settlement:
    return Settlement.of(draw, prompt, completion, estimated=False, how="usage", status=200,
                         latency_ms=1)  # fmt: skip


def test_a_call_settles_once_and_a_second_settlement_charges_nothing(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with _metered(journal_url, tmp_path, 5000, state_dir) as (charter, worker, meter):
        reserved = meter.reserve(worker, ChatRequest.parse(b'{"messages": [], "max_tokens": 9}'))
        assert reserved.reserved == 9 + 9  # 34 bytes / 4 + 9
        assert meter.in_flight(worker) == BLOCK_CALLS * 18  # the block it drew from
        first = meter.settle(_usage(reserved, 3, 4))
        again = meter.settle(_usage(reserved, 3, 4))
        assert first is not None
        assert again is None
        assert meter.in_flight(worker) == BLOCK_CALLS * 18 - 7  # its charge is the lease's
        meter.finish(worker)
        assert meter.in_flight(worker) == 0
        entries = [e.event for e in charter.journal.entries()]
        assert sum(isinstance(e, ModelCallSettled) for e in entries) == 1
        usage = [e for e in entries if isinstance(e, UsageRecorded) and e.lineage == worker]
        assert [u.amount.tokens for u in usage] == [7]
        assert check_model_calls(journal_history(charter.journal)).problems == []


def test_draws_within_a_block_make_no_append(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with _metered(journal_url, tmp_path, 5000, state_dir) as (charter, worker, meter):
        before = len(list(charter.journal.entries()))
        draws = [meter.reserve(worker, CALL)]
        after_hold = len(list(charter.journal.entries()))
        (held,) = [e.event for e in list(charter.journal.entries())[before:]]
        assert isinstance(held, ModelTokensHeld)
        assert (held.lineage, held.tokens) == (worker, BLOCK_CALLS * 18)
        draws += [meter.reserve(worker, CALL) for _ in range(BLOCK_CALLS - 1)]
        assert (
            len(list(charter.journal.entries())) == after_hold
        )  # drawn in memory: nothing appended
        assert {d.block.block for d in draws} == {held.block}
        # The block is spent: the next call holds a new one (the old stays held, its
        # calls in flight), and the settlement of the old one's last call releases it.
        draws.append(meter.reserve(worker, CALL))
        assert draws[-1].block.block != held.block
        for draw in draws:
            assert meter.settle(_usage(draw, 3, 4)) is not None
        entries = [e.event for e in list(charter.journal.entries())[before:]]
        (released,) = [e for e in entries if isinstance(e, ModelTokensReleased)]
        assert (released.block, released.recovered, released.charged) == (held.block, False, 0)
        assert isinstance(entries[entries.index(released) - 1], ModelCallSettled)
        meter.finish(worker)  # the worker's end releases the other
        assert sum(isinstance(e.event, ModelTokensReleased) for e in charter.journal.entries()) == 2
        assert check_model_calls(journal_history(charter.journal)).problems == []


def test_a_settlement_queued_counts_its_charge_before_a_refusal(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # Each call reserves 18 of a lease of 30 (its block, cut to the lease, is 30): a
    # second call fits only because the first's settlement (7 tokens), still queued,
    # is journaled first, so its block is released and the next held from what is left.
    with _metered(journal_url, tmp_path, 30, state_dir) as (charter, worker, meter):
        first = meter.reserve(worker, CALL)
        assert first.block.tokens == 30
        answered = _usage(first, 3, 4)
        meter._queued.append(answered)  # queued, the settler not yet at it
        second = meter.reserve(worker, CALL)
        assert answered.committed
        assert (second.block.tokens, first.block.released) == (30 - 7, True)
        entries = list(charter.journal.entries())
        hold = next(e for e in entries if isinstance(e.event, ModelTokensHeld)
                    and e.event.block == second.block.block)  # fmt: skip
        (release,) = [e for e in entries if isinstance(e.event, ModelTokensReleased)]
        assert release.batch == hold.batch  # released in the next hold's append
        # A call the lease cannot cover is refused, and reserves nothing.
        big = ChatRequest.parse(b'{"messages": [], "max_tokens": 99}')
        with pytest.raises(ModelTokensError):
            meter.reserve(worker, big)
        meter.settle(_usage(second, 2, 2))
        meter.finish(worker)
        assert meter.in_flight(worker) == 0
        entries = [e.event for e in charter.journal.entries()]
        settled = [e for e in entries if isinstance(e, ModelCallSettled)]
        assert [s.call for s in settled] == [first.call, second.call]
        usage = [e for e in entries if isinstance(e, UsageRecorded) and e.lineage == worker]
        assert [u.amount.tokens for u in usage] == [7, 4]
        assert check_model_calls(journal_history(charter.journal)).problems == []


def test_sixteen_threads_across_block_boundaries_never_overspend(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # 16 threads call and settle (some exactly, some at their whole reservation) on one
    # lease with room for about 40 calls, drawing from block after block: the fold
    # checks at every hold that charged + held stays within the lease.
    lease = 40 * 18
    with _metered(journal_url, tmp_path, lease, state_dir) as (charter, worker, meter):
        made: list[Draw] = []
        refused: list[int] = []
        lock = threading.Lock()

        def calls(n: int) -> None:
            for i in range(12):
                try:
                    draw = meter.reserve(worker, CALL)
                except ModelTokensError:
                    with lock:
                        refused.append(n)
                    continue
                with lock:
                    made.append(draw)
                whole = (n + i) % 3 == 0
                settlement = _usage(draw, 9, 9 if whole else 1)
                if i % 2:
                    meter.queue(settlement)
                else:
                    meter.settle(settlement)

        threads = [threading.Thread(target=calls, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        meter.finish(worker)
        assert meter.in_flight(worker) == 0
        assert refused  # the lease ran out: some calls were refused
        assert len({d.block.block for d in made}) > 2  # across block boundaries
        usage = [u for u in of_events(charter, UsageRecorded) if u.lineage == worker]
        assert sum(u.amount.tokens for u in usage) <= lease
        settled = of_events(charter, ModelCallSettled)
        assert sorted(s.call for s in settled) == sorted(d.call for d in made)
        assert check_model_calls(journal_history(charter.journal)).problems == []


def of_events(charter: Charter, kind: type[E]) -> list[E]:
    return [e.event for e in charter.journal.entries() if isinstance(e.event, kind)]


def test_queued_settlements_of_a_lease_are_journaled_in_one_append(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # The settler finds three answered calls queued (it was busy): one append, one
    # UsageRecorded charging their sum, then the three settlements.
    with _metered(journal_url, tmp_path, 5000, state_dir) as (charter, worker, meter):
        draws = [meter.reserve(worker, CALL) for _ in range(3)]
        answered = [_usage(d, 3, n) for n, d in enumerate(draws, start=1)]
        with meter._settling:  # the settler busy: all three wait for it
            for settlement in answered:
                meter.queue(settlement)
        deadline = time.monotonic() + 30
        while not all(s.committed for s in answered) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(s.committed for s in answered)
        entries = list(charter.journal.entries())
        at = next(i for i, e in enumerate(entries) if isinstance(e.event, ModelCallSettled))
        run = entries[at - 1 : at + 3]
        assert [type(e.event) for e in run] == [UsageRecorded] + [ModelCallSettled] * 3
        assert len({e.batch for e in run}) == 1
        assert run[0].event.amount.tokens == (3 + 1) + (3 + 2) + (3 + 3)
        assert [e.event.call for e in run[1:]] == [d.call for d in draws]
        meter.finish(worker)
        assert check_model_calls(journal_history(charter.journal)).problems == []


def _settled_one(meter: ModelMeter, worker: str) -> Draw:
    """One call of ``worker`` reserved and settled at 3 + 4 tokens."""
    draw = meter.reserve(worker, CALL)
    assert meter.settle(_usage(draw, 3, 4)) is not None
    return draw


def test_a_call_still_in_flight_at_the_workers_end_is_charged_before_its_lease_returns(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # The worker's end (finish) finds a call of its lease's block still in flight (its
    # thread stuck past the door's drain): the block is recovered then, charging what
    # its settled calls had not, so the lease that returns next has the call's tokens
    # charged; the late settlement finds its block released and charges nothing again.
    # Before, the block stayed held in the journal for good and the late settlement
    # came after the lease returned (uncharged, once the lease had ended).
    with _metered(journal_url, tmp_path, 5000, state_dir) as (charter, worker, meter):
        done = _settled_one(meter, worker)
        late = meter.reserve(worker, CALL)  # same block, still in flight
        assert late.block is done.block
        meter.finish(worker)
        (released,) = of_events(charter, ModelTokensReleased)
        assert (released.block, released.recovered) == (late.block.block, True)
        assert released.charged == BLOCK_CALLS * 18 - 7 >= late.reserved
        assert meter.settle(_usage(late, 2, 2)) is None  # in the release's charge
        usage = [u for u in of_events(charter, UsageRecorded) if u.lineage == worker]
        assert sum(u.amount.tokens for u in usage) == BLOCK_CALLS * 18
        assert meter.in_flight(worker) == 0
        assert check_model_calls(journal_history(charter.journal)).problems == []


class _HangingUpMeter(ModelMeter):
    """A meter whose reservation ends with its worker's connections hung up: the
    worker's end (``Door.unregister``) arriving while the call's block is appended."""

    door: ModelDoor | None = None

    def reserve(self, lineage: str, request: ChatRequest) -> Draw:
        draw = super().reserve(lineage, request)
        if self.door is not None:
            self.door.hang_up(lambda _: True)
        return draw


@pytest.mark.parametrize("hang_up", [False, True])
def test_a_call_whose_worker_ended_during_its_reservation_is_never_sent(
    journal_url: str, tmp_path: Path, state_dir: Path, hang_up: bool
) -> None:
    # The door hangs up a worker's connections and their upstream sockets; a call then
    # inside its reservation connects upstream only afterwards: it must send nothing
    # (else, the answer slower than the door's 5 s drain, its settlement comes after the
    # lease returned, uncharged), and its settlement is queued before its thread ends.
    # The positive control (no hang-up) is sent and charged the server's usage.
    with (
        _metered(journal_url, tmp_path, 5000, state_dir) as (charter, worker, plain),
        model_server() as (url, behaviour),
    ):
        meter = _HangingUpMeter(plain._cell)
        door = ModelDoor(
            state_dir / f"model-hang-{hang_up}.sock", member=lambda _uid: None,
            holder=lambda _uid: ("sandbox", worker), meter=lambda: meter,
            endpoint=ModelEndpoint(url),
        )  # fmt: skip
        meter.door = door if hang_up else None
        ours, theirs = socket.socketpair()
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        theirs.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: charter\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        if not hang_up:
            theirs.shutdown(socket.SHUT_WR)  # one request: the connection ends after it
        try:
            door._serve(ours, 0)  # returns when the connection ends
            assert len(meter._queued) + len(of_events(charter, ModelCallSettled)) == 1
            meter.finish(worker)
            (settled,) = of_events(charter, ModelCallSettled)
            if hang_up:
                assert behaviour.seen == []  # nothing sent for a worker that ended
                assert (settled.how, settled.completion_tokens) == ("client-gone", 0)
            else:
                assert len(behaviour.seen) == 1
                assert settled.how == "usage"
            usage = [u for u in of_events(charter, UsageRecorded) if u.lineage == worker]
            assert sum(u.amount.tokens for u in usage) == (
                settled.prompt_tokens + settled.completion_tokens
            )
            assert check_model_calls(journal_history(charter.journal)).problems == []
        finally:
            door.close()
            ours.close()
            theirs.close()


def test_a_spawn_cannot_carve_out_the_tokens_a_block_holds(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # A worker's first call holds a block of 8 calls (144 tokens of its 400) and settles
    # charging 18. Its lease book counts the block's tokens less that charge (126) as
    # held, so what it shows left is 400 - 18 - 126: a spawn asking one token more is
    # refused (the block still lends those tokens), and one within it (the positive
    # control) commits. The worker's next call then draws from its block, and every
    # token the model spent is charged to a lease.
    with initialise(journal_url, tmp_path / "home") as charter:
        worker, spawn = spawning_caller(charter, 400)
        meter = ModelMeter(model_cell(charter, state_dir, None))
        first = meter.reserve(worker, CALL)
        assert first.block.tokens == BLOCK_CALLS * 18
        assert meter.settle(_usage(first, 9, 9)) is not None
        left = charter.budgets().remaining(worker).tokens
        assert left == 400 - 18 - (BLOCK_CALLS * 18 - 18)
        with pytest.raises(InsufficientBudgetError):
            spawn(left + 1)
        spawn(left)  # committed
        assert charter.budgets().remaining(worker).tokens == 0
        second = meter.reserve(worker, CALL)  # drawn from the block, which holds it
        assert second.block is first.block
        assert meter.settle(_usage(second, 9, 9)) is not None
        meter.finish(worker)
        usage = [u for u in of_events(charter, UsageRecorded) if u.lineage == worker]
        assert sum(u.amount.tokens for u in usage) == 36
        assert sum(u.refused.tokens for u in usage) == 0, "tokens spent that no lease covers"
        history = journal_history(charter.journal)
        assert check_model_calls(history).problems == []
        # The independent fold agrees: the same spawn forged one token wider (as only a
        # database writer could append it) carves a token the block held, and is found.
        at = max(i for i, e in enumerate(history) if e[1] == "LeaseGranted")
        position, kind, payload, recorded = history[at]
        assert payload["parent"] == worker
        wider = payload | {"allocation": payload["allocation"] | {"tokens": left + 1}}
        forged = [*history[:at], (position, kind, wider, recorded), *history[at + 1 :]]
        (problem,) = check_model_calls(forged).problems
        assert problem.startswith(f"{position}: {worker} holds")


def test_the_fold_finds_a_settlement_charged_in_another_append(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # The fold says each settlement charges its tokens in its own append. A history
    # whose UsageRecorded is the entry before the settlement but of an earlier append
    # (its recorded time another: as the semantic audit tells appends apart) is found;
    # the history as journaled (the positive control) is not.
    with _metered(journal_url, tmp_path, 5000, state_dir) as (charter, worker, meter):
        _settled_one(meter, worker)
        meter.finish(worker)
        history = journal_history(charter.journal)
        assert check_model_calls(history).problems == []
        at = next(i for i, e in enumerate(history) if e[1] == "ModelCallSettled")
        assert history[at - 1][1] == "UsageRecorded"
        position, kind, payload, recorded = history[at - 1]
        forged = list(history)
        forged[at - 1] = (position, kind, payload, recorded - timedelta(seconds=1))
        assert check_model_calls(forged).problems != []


def test_a_settlement_that_failed_is_charged_by_the_workers_end(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An answered call whose settlement could not be journaled (the journal failed, and
    # its fallback too) keeps its block held. The worker's end must then charge what
    # the block holds (fail-closed, as a recovery would), else the answered call is
    # never charged and its lease returns whole. The positive control: the other call,
    # settled before the failure, is charged exactly once.
    with _metered(journal_url, tmp_path, 5000, state_dir) as (charter, worker, meter):
        ok, lost = meter.reserve(worker, CALL), meter.reserve(worker, CALL)
        assert meter.settle(_usage(ok, 3, 4)) is not None
        cell = meter._cell

        def failing(*_a: object, **_k: object) -> None:
            raise AppendFailedError("the journal failed")

        with monkeypatch.context() as m:
            m.setattr(cell.budgets, "record_usage", failing)
            m.setattr(cell.journal, "append", failing)
            assert meter.settle(_usage(lost, 3, 4)) is None  # tried once, not on record
        meter.finish(worker)
        usage = [u for u in of_events(charter, UsageRecorded) if u.lineage == worker]
        charged = sum(u.amount.tokens for u in usage)
        assert charged >= 7 + 7, f"the lost call's tokens: {charged} charged"
        assert meter.in_flight(worker) == 0
        assert check_model_calls(journal_history(charter.journal)).problems == []


def test_a_settlement_committed_but_reported_failed_leaves_nothing_uncharged(
    journal_url: str, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A settlement's append commits but reports a failure (an outcome unknown): the
    # meter's version of its block is then behind, so the next settlement on that block
    # conflicts and is taken for a recovery's. Nothing may then go uncharged: the
    # worker's end recovers the block from the journal. The positive control: the call
    # whose append committed is charged once.
    with _metered(journal_url, tmp_path, 5000, state_dir) as (charter, worker, meter):
        first, second = meter.reserve(worker, CALL), meter.reserve(worker, CALL)
        cell = meter._cell
        real = cell.budgets.record_usage

        def committed_but_failed(*a: Any, **k: Any) -> Any:
            real(*a, **k)
            raise AppendFailedError("the answer was lost")

        with monkeypatch.context() as m:
            m.setattr(cell.budgets, "record_usage", committed_but_failed)
            meter.settle(_usage(first, 3, 4))
        meter.settle(_usage(second, 3, 4))
        meter.finish(worker)
        usage = [u for u in of_events(charter, UsageRecorded) if u.lineage == worker]
        assert sum(u.amount.tokens for u in usage) >= 7 + 7
        assert meter.in_flight(worker) == 0
        assert check_model_calls(journal_history(charter.journal)).problems == []
