"""`charter model configure|show`: the one place the model endpoint and its key are kept
(the home, mode 0600), never shown, read by the cell's door."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from charter.budgets import UsageRecorded
from charter.core import BadInputError
from charter.runner.errors import ModelRequestError, ModelTokensError
from charter.runner.events import ModelCallReserved, ModelCallSettled
from charter.runner.model import (
    ChatRequest,
    ModelEndpoint,
    ModelMeter,
    Settlement,
    load_endpoint,
    prompt_estimate,
)
from tests.invariants import check_model_calls, journal_history
from tests.runner.conftest import initialise
from tests.runner.programs import python
from tests.runner.test_model_door import model_cell, spawn_callers


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


def test_a_call_settles_once_and_a_second_settlement_charges_nothing(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    with initialise(journal_url, tmp_path / "home") as charter:
        (worker,) = (str(c.lineage) for c in spawn_callers(charter, 5000, python("")).children)
        meter = ModelMeter(model_cell(charter, state_dir, None))
        reserved = meter.reserve(worker, ChatRequest.parse(b'{"messages": [], "max_tokens": 9}'))
        assert meter.in_flight(worker) == reserved.reserved == 9 + 9  # 34 bytes / 4 + 9
        first = meter.settle(
            Settlement.of(reserved, 3, 4, estimated=False, how="usage", status=200, latency_ms=1)
        )
        again = meter.settle(
            Settlement.of(reserved, 3, 4, estimated=False, how="usage", status=200, latency_ms=1)
        )
        assert first is not None
        assert again is None
        assert meter.in_flight(worker) == 0
        entries = [e.event for e in charter.journal.entries()]
        assert sum(isinstance(e, ModelCallSettled) for e in entries) == 1
        usage = [e for e in entries if isinstance(e, UsageRecorded) and e.lineage == worker]
        assert [u.amount.tokens for u in usage] == [7]
        assert check_model_calls(journal_history(charter.journal)).problems == []


def test_a_settlement_rides_in_the_next_reservations_append_and_counts_its_charge(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    # Each call reserves 9 (34 bytes / 4, rounded up) + 9 = 18 of a lease of 30: a
    # second call fits only because the first's settlement (7 tokens) is counted in
    # place of its reservation (18), in the same append.
    call = ChatRequest.parse(b'{"messages": [], "max_tokens": 9}')
    with initialise(journal_url, tmp_path / "home") as charter:
        (worker,) = (str(c.lineage) for c in spawn_callers(charter, 30, python("")).children)
        meter = ModelMeter(model_cell(charter, state_dir, None))
        first = meter.reserve(worker, call)
        answered = Settlement.of(
            first, 3, 4, estimated=False, how="usage", status=200, latency_ms=1
        )
        second = meter.reserve(worker, call, answered)
        assert answered.committed
        assert meter.in_flight(worker) == second.reserved == 18
        entries = list(charter.journal.entries())
        at = next(i for i, e in enumerate(entries) if isinstance(e.event, ModelCallSettled))
        one = entries[at - 1 : at + 2]
        assert [type(e.event) for e in one] == [UsageRecorded, ModelCallSettled, ModelCallReserved]
        assert len({e.batch for e in one}) == 1  # one append: one commit for both
        assert one[0].event.amount.tokens == 7
        assert one[2].event.call == second.call
        # A call refused still settles the one before it (once), and reserves nothing.
        big = ChatRequest.parse(b'{"messages": [], "max_tokens": 99}')
        answered = Settlement.of(
            second, 2, 2, estimated=False, how="usage", status=200, latency_ms=1
        )
        with pytest.raises(ModelTokensError):
            meter.reserve(worker, big, answered)
        assert answered.committed
        assert meter.in_flight(worker) == 0
        assert meter.settle(answered) is None  # never twice
        entries = [e.event for e in charter.journal.entries()]
        settled = [e for e in entries if isinstance(e, ModelCallSettled)]
        assert [s.call for s in settled] == [first.call, second.call]
        usage = [e for e in entries if isinstance(e, UsageRecorded) and e.lineage == worker]
        assert [u.amount.tokens for u in usage] == [7, 4]
        assert sum(isinstance(e, ModelCallReserved) for e in entries) == 2
        assert check_model_calls(journal_history(charter.journal)).problems == []
