"""A flood of egress attempts costs the control plane a bounded number of records: the
broker aggregates attempts per (destination, allowed, reason), keeps at most
``_MAX_RECORDS`` of them per sandbox and counts the rest in one overflow record, so the
journal gets at most ``_MAX_RECORDS + 1`` EgressAttempted entries per sandbox."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import EgressAttempted, EgressBroker, EgressGrant, Launcher, MemorySink
from charter.sandbox import egress as egress_module

from ._support import out, sandboxed
from .test_egress import PAYLOAD, _Server

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=120s,cpu=120s,mem=64MiB,egress=10MB")
FLOOD = 5000

# Inside the sandbox: argv[2] CONNECTs, one after another, each to a distinct address
# (argv[1] == "many") or all to one (argv[1] == "one"); print how each was answered.
ATTACK = """
import json, os, socket, sys
mode, n = sys.argv[1], int(sys.argv[2])
path = os.environ["CHARTER_EGRESS_SOCKET"]
statuses = {}
for i in range(n):
    target = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:443"
    if mode == "one":
        target = "blocked.test:443"
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except OSError:
        pass
    s.close()
    status = data.split(b" ")[1].decode() if data.count(b" ") else "none"
    statuses[status] = statuses.get(status, 0) + 1
print(json.dumps(statuses))
"""

# Inside the sandbox: CONNECT to each argument in turn; through an open tunnel, ask for
# the payload. Print each status and the bytes that followed the head.
FEW = """
import os, socket, sys
for target in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["CHARTER_EGRESS_SOCKET"])
    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
    data = b""
    while b"\\r\\n\\r\\n" not in data and (chunk := s.recv(4096)):
        data += chunk
    head, _, rest = data.partition(b"\\r\\n\\r\\n")
    status, n = head.split(b" ")[1].decode(), len(rest)
    if status == "200":
        s.sendall(b"go\\n")
    while chunk := s.recv(65536):
        n += len(chunk)
    s.close()
    print(status, n if status == "200" else 0)
"""


@dataclass
class _Watch:
    """What the broker recorded, per uid: attempts seen and the most records held."""

    seen: dict[int, int] = field(default_factory=dict)
    most: dict[int, int] = field(default_factory=dict)


@pytest.fixture
def broker(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EgressBroker]:
    # These tests are about the records a flood leaves, so every attempt must reach the
    # head parser: no request allowance here (test_broker_budget.py tests that).
    monkeypatch.setattr(egress_module, "_REQUEST_BURST", 1e9)
    with EgressBroker(state_dir / "egress.sock") as b:
        yield b


@pytest.fixture
def watch(broker: EgressBroker, monkeypatch: pytest.MonkeyPatch) -> _Watch:
    """Count every attempt the broker records and the records it holds after each."""
    w, lock = _Watch(), threading.Lock()
    record = broker._record

    def counted(uid: int, reg: egress_module._Registration, *args: object, **kw: object) -> None:
        record(uid, reg, *args, **kw)  # type: ignore[arg-type]
        with broker._lock:
            held = len(reg.records)
        with lock:
            w.seen[uid] = w.seen.get(uid, 0) + 1
            w.most[uid] = max(w.most.get(uid, 0), held)

    monkeypatch.setattr(broker, "_record", counted)
    return w


@pytest.fixture
def launcher(state_dir: Path, sink: MemorySink, broker: EgressBroker) -> Launcher:
    return Launcher(sink, state_dir=state_dir, egress=broker)


def _journaled(sink: MemorySink, sandbox_id: str) -> list[EgressAttempted]:
    return [e for e in sink.events if isinstance(e, EgressAttempted) and e.sandbox_id == sandbox_id]


@pytest.mark.parametrize("mode", ["many", "one"])
def test_a_flood_of_refused_connects_journals_a_bounded_number_of_records(
    launcher: Launcher, sink: MemorySink, watch: _Watch, mode: str
) -> None:
    cap = egress_module._MAX_RECORDS
    o = sandboxed(launcher, B, ATTACK, mode, str(FLOOD))
    statuses = json.loads(out(o))
    assert sum(statuses.values()) == FLOOD
    assert set(statuses) <= {"403", "429"}  # refused: not in the grant, or too many at once
    journaled = _journaled(sink, o.sandbox_id)
    uid = journaled[0].host_uid
    # Every attempt reached the broker, and every one is counted in the journal ...
    assert watch.seen[uid] == FLOOD
    assert sum(e.count for e in journaled) == FLOOD
    # ... in a bounded number of entries, from a bounded number of records at any time.
    assert len(journaled) <= cap + 1
    assert watch.most[uid] <= cap
    assert not any(e.allowed for e in journaled)
    assert sum(e.bytes_in + e.bytes_out for e in journaled) == 0
    refused = [e for e in journaled if e.reason == "destination not in the grant"]
    if mode == "many":
        # The first ``cap`` distinct destinations each keep a record; the rest overflow.
        assert len(journaled) == cap + 1
        assert all(e.count == 1 for e in refused)
        (overflow,) = [e for e in journaled if e.destination == "(other)"]
        assert overflow.reason == "over the record cap"
        kept = sum(e.count for e in journaled if e is not overflow)
        assert overflow.count == FLOOD - kept >= FLOOD - cap - statuses.get("429", 0)
    else:
        (one,) = refused
        assert (one.destination, one.count) == ("blocked.test:443", statuses["403"])
        assert len(journaled) <= 2  # and at most a record of refusals at the connection cap
    print(f"\n{mode}: {FLOOD} attempts, {statuses}, {len(journaled)} entries, "
          f"at most {watch.most[uid]} records held")  # fmt: skip


def test_below_the_cap_each_destination_has_its_own_record(
    launcher: Launcher, sink: MemorySink, server: _Server
) -> None:
    """The positive control: a few attempts, each distinct outcome its own record, its
    count the attempts behind it and its bytes their sum; a long destination is cut."""
    long_name = "a" * 300 + ".test:443"
    mine = f"127.0.0.1:{server.port}"
    grant = EgressGrant(destinations=(mine,), byte_budget=10 * PAYLOAD)
    targets = ["a.test:443", mine, "b.test:443", "b.test:443", mine, "c.test:443", long_name]
    o = sandboxed(launcher, B, FEW, *targets, grant=grant)
    assert out(o).splitlines() == [
        "403 0", f"200 {PAYLOAD}", "403 0", "403 0", f"200 {PAYLOAD}", "403 0", "403 0",
    ]  # fmt: skip
    records = [
        (e.destination, e.allowed, e.count, e.bytes_in) for e in _journaled(sink, o.sandbox_id)
    ]
    assert records == [
        ("a.test:443", False, 1, 0), (mine, True, 2, 2 * PAYLOAD), ("b.test:443", False, 2, 0),
        ("c.test:443", False, 1, 0), (long_name[: egress_module._DESTINATION_KEPT], False, 1, 0),
    ]  # fmt: skip
    assert o.usage.egress_bytes == 2 * PAYLOAD + 2 * len(b"go\n")
    # An entry written before ``count`` existed still decodes, as one attempt.
    old = _journaled(sink, o.sandbox_id)[1].model_dump(mode="json", exclude={"count"})
    assert EgressAttempted.model_validate(old).count == 1


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.sock.close()
