"""Both brokers spend a thread in the parent per connection, outside any sandbox's cgroup:
a uid holds at most a few of them, and a uid the broker does not know gets none."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from charter.sandbox import EgressBroker, EgressGrant, KeyBroker, verify_signature
from charter.sandbox import egress as egress_module
from charter.sandbox import keys as keys_module

from ._brokers import HERE, Appended
from ._support import PY, on_host
from .test_egress import CLIENT, PAYLOAD, _Server

pytestmark = pytest.mark.sandbox

FLOOD_UID, STRANGER_UID = 60994, 60995
EXTRA = 8  # connections opened beyond the cap

# As the flooding uid: open argv[3] idle connections in order. The broker accepts them in
# that order, so those beyond the cap (argv[2]) are the ones that must be answered and
# closed; read each to its end. Then report how many of the first ones are still open
# (connected, nothing said: a broker thread is waiting on each), and hold them all until
# told to let go on stdin.
HOLD = """
import json, socket, sys
path, cap, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conns = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    conns.append(s)
refused = []
for s in conns[cap:]:
    s.settimeout(5)
    data, end = b"", "EOF"
    try:
        while chunk := s.recv(4096):
            data += chunk
    except OSError as e:
        end = type(e).__name__
    refused.append(((data.decode().splitlines() or ["-"])[0], end))
still_open = 0
for s in conns[:cap]:
    s.setblocking(False)
    try:
        s.recv(1)
    except BlockingIOError:
        still_open += 1
print(json.dumps({"open": still_open, "refused": refused}), flush=True)
sys.stdin.readline()
for s in conns:
    s.close()
"""

# On the host as any uid: ask for a signature (or, with no handle, say nothing) and print
# the broker's reply line and how the connection ended.
SIGN = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
if len(sys.argv) > 2:
    s.sendall(json.dumps({"handle": sys.argv[2], "tag": "worker/report",
                          "message_hex": b"result".hex()}).encode() + b"\\n")
data, end = b"", "EOF"
try:
    while chunk := s.recv(4096):
        data += chunk
except OSError as e:
    end = type(e).__name__
print(json.dumps({"reply": json.loads(data or b"{}"), "end": end}))
"""


@contextmanager
def _flood(path: Path, uid: int, cap: int) -> Iterator[dict[str, Any]]:
    """Hold ``cap + EXTRA`` idle connections from ``uid``; yield the holder's report;
    close them all on exit."""
    proc = subprocess.Popen(
        [PY, "-I", "-c", HOLD, str(path), str(cap), str(cap + EXTRA)],
        user=uid, group=uid, extra_groups=[], text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield json.loads(proc.stdout.readline() or "{}")  # bounded: 5 s per refused socket
    finally:
        proc.communicate("\n", timeout=30)


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def _all_end(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)


def test_egress_caps_the_connections_of_one_uid(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The held connections must stay held while they are counted.
    monkeypatch.setattr(egress_module, "_HEAD_TIMEOUT", 60.0)
    cap = egress_module._MAX_CONNECTIONS_PER_UID
    server = _Server()
    name = f"egress-conn-{FLOOD_UID}"
    try:
        with EgressBroker(state_dir / "egress-flood.sock") as broker:
            grant = EgressGrant(destinations=(f"127.0.0.1:{server.port}",))
            broker.register(FLOOD_UID, "sbx-flood", grant, byte_cap=10 * PAYLOAD,
                            cgroup=HERE, journal=Appended())  # fmt: skip
            # The attack: far more idle connections than the cap, from one sandbox uid.
            with _flood(broker.path, FLOOD_UID, cap) as report:
                threads = _threads(name)
                assert report == {
                    "open": cap,
                    "refused": [["HTTP/1.1 429 too many connections", "EOF"]] * EXTRA,
                }
                assert len(threads) == cap
                assert broker.active(FLOOD_UID) == cap
            # Refusals at the cap are counted into one record, not journaled once each.
            reasons = [a.reason for a in broker.attempts(FLOOD_UID)]
            assert reasons.count("too many concurrent connections") == 1
            # Every thread ends once its connection closes, and gives its slot back.
            _all_end(threads)
            assert broker.active(FLOOD_UID) == 0
            # Control: the same uid is served normally afterwards.
            code = CLIENT.replace('os.environ["CHARTER_EGRESS_SOCKET"]', repr(str(broker.path)))
            r = on_host(code, str(server.port), user=FLOOD_UID)
            assert r.stdout.split() == ["200", str(PAYLOAD)]
            assert _threads(name) == []
    finally:
        server.sock.close()


def test_keys_caps_the_connections_of_one_uid(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keys_module, "_REQUEST_TIMEOUT", 60.0)
    cap = keys_module._MAX_CONNECTIONS_PER_UID
    name = f"keys-conn-{FLOOD_UID}"
    with KeyBroker(state_dir / "keys-flood.sock") as broker:
        assert broker.path is not None
        broker.register(FLOOD_UID, "sbx-flood", cgroup=HERE)
        handle = broker.issue(bytearray(secrets.token_bytes(32)), sandbox_id="sbx-flood")
        with _flood(broker.path, FLOOD_UID, cap) as report:
            threads = _threads(name)
            assert report == {
                "open": cap,
                "refused": [['{"error": "too many connections"}', "EOF"]] * EXTRA,
            }
            assert len(threads) == cap
            assert broker.active(FLOOD_UID) == cap
        _all_end(threads)
        assert broker.active(FLOOD_UID) == 0
        # Control: the same uid gets a signature that verifies.
        r = json.loads(on_host(SIGN, str(broker.path), handle, user=FLOOD_UID).stdout)
        assert r["end"] == "EOF"
        sig = bytes.fromhex(r["reply"]["signature_hex"])
        assert verify_signature(broker.public_key(handle), "worker/report", b"result", sig)


def test_keys_refuses_a_uid_without_a_handle_before_a_thread(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A started thread would wait a minute for the line; the client gives up after 5 s.
    monkeypatch.setattr(keys_module, "_REQUEST_TIMEOUT", 60.0)
    with KeyBroker(state_dir / "keys-stranger.sock") as broker:
        assert broker.path is not None
        assert broker._server is not None
        served: list[int] = []
        serve = broker._server.handler

        def counted(conn: socket.socket, uid: int) -> None:
            served.append(uid)
            serve(conn, uid)

        monkeypatch.setattr(broker._server, "handler", counted)
        # A handle issued to someone else does not admit this uid, nor does a
        # registration with no handle.
        broker.register(FLOOD_UID, "sbx-flood", cgroup=HERE)
        broker.register(STRANGER_UID, "sbx-stranger", cgroup=HERE)
        broker.issue(bytearray(secrets.token_bytes(32)), sandbox_id="sbx-flood")
        r = json.loads(on_host(SIGN, str(broker.path), user=STRANGER_UID).stdout)
        assert r == {"reply": {"error": "no key handle was issued to this sandbox"}, "end": "EOF"}
        assert served == []
        # Control: once a handle is issued to the uid, it gets a thread and a signature.
        handle = broker.issue(bytearray(secrets.token_bytes(32)), sandbox_id="sbx-stranger")
        r = json.loads(on_host(SIGN, str(broker.path), handle, user=STRANGER_UID).stdout)
        assert "signature_hex" in r["reply"]
        assert served == [STRANGER_UID]
