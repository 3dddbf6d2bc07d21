"""The door's JSON-RPC 2.0, frame by frame, against a stand-in cell (no sandbox: the
peer is this test process, registered with its own uid and cgroup, as the pool would
register a sandbox). Every frame gets a reply or is a notification; no frame kills the
connection's thread; the spec's own examples are test vectors; counters and threads
belong to the sandbox holding a uid, not to the uid."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import charter.runner.door as door_module
from charter.runner.door import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_BATCH,
    MAX_CONNECTIONS,
    METHOD_NOT_FOUND,
    OVER_LIMIT,
    PARSE_ERROR,
    REFUSED,
    Door,
)
from charter.runner.errors import NotAWorkerError
from charter.sandbox._peer import cgroup_dirs_of

# A door thread that dies with an exception fails the test that killed it.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

UID = os.getuid()


class StandInCell:
    """What the door asks of a cell: who holds a uid, and the result journal."""

    cell = "stand-in"

    def __init__(self) -> None:
        self.changed = threading.Condition(threading.RLock())
        self.by_uid: dict[int, str] = {}
        self.results: list[tuple[str, bytes]] = []

    def knows_uid(self, uid: int) -> bool:
        return uid in self.by_uid

    def lineage_of(self, uid: int) -> str:
        with self.changed:
            lineage = self.by_uid.get(uid)
        if lineage is None:
            raise NotAWorkerError("no live worker of this cell runs as this peer")
        return lineage

    def journal_result(self, lineage: str, data: bytes) -> str:
        self.results.append((lineage, data))
        return hashlib.sha256(data).hexdigest()

    def door_call(self, lineage: str, method: str, amount: int) -> None:
        """The counts supervision keeps per worker: nothing to keep here."""
        del lineage, method, amount


class Peer:
    """A door, its stand-in cell, and this process registered as sandbox ``sandbox``."""

    def __init__(self, path: Path, max_requests: int) -> None:
        self.door = Door(path, max_requests=max_requests)
        self.cell = StandInCell()
        self.door.cell = self.cell  # type: ignore[assignment]

    def hold(self, sandbox_id: str, lineage: str) -> None:
        """``sandbox_id`` runs on this uid with ``lineage`` in it (the pool's register,
        the key issued, the cell's start)."""
        self.door.register(UID, sandbox_id, cgroup=tuple(cgroup_dirs_of(os.getpid())))
        self.door.issue(bytearray(secrets.token_bytes(32)), sandbox_id=sandbox_id)
        with self.cell.changed:
            self.cell.by_uid[UID] = lineage

    def end(self) -> None:
        """The sandbox ends: the cell forgets its worker, the pool unregisters it."""
        with self.cell.changed:
            self.cell.by_uid.pop(UID, None)
            self.cell.changed.notify_all()
        self.door.unregister(UID)

    def connect(self) -> Conn:
        assert self.door.path is not None
        return Conn(self.door.path)


class Conn:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.reader = self.sock.makefile("rb")

    def send(self, frame: bytes | str) -> None:
        data = frame.encode() if isinstance(frame, str) else frame
        self.sock.sendall(data + b"\n")

    def reply(self) -> Any:
        line = self.reader.readline()
        assert line, "the door closed the connection"
        return json.loads(line)  # always valid JSON (json.loads refuses nothing, so:)

    def ask(self, frame: bytes | str) -> Any:
        self.send(frame)
        return self.reply()

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[Peer]:
    p = Peer(tmp_path / "door-test.sock", max_requests=1000)
    p.hold("sbx-one", "agent:estate/sa-1")
    try:
        yield p
    finally:
        p.door.close()


def _strict(line: bytes) -> Any:
    """Parse as strict JSON: no NaN, no Infinity (what any other JSON parser takes)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


WHOAMI = '{"jsonrpc": "2.0", "method": "whoami", "id": 7}'


# -- 1. robustness: invalid Unicode, and no dead thread --------------------------------


def test_a_lone_surrogate_is_a_parse_error_and_the_connection_lives(peer: Peer) -> None:
    conn = peer.connect()
    # The attack: a lone surrogate, escaped, in the text the door journals.
    bad = '{"jsonrpc": "2.0", "method": "result", "params": {"text": "\\ud800"}, "id": 1}'
    reply = conn.ask(bad)
    assert reply["error"]["code"] == PARSE_ERROR, reply
    assert reply["id"] is None
    assert peer.cell.results == []  # nothing half-journaled
    # Raw bytes that are not UTF-8 (a CESU surrogate, an overlong, a stray byte).
    for raw in (b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'"\xff"'):
        assert conn.ask(raw)["error"]["code"] == PARSE_ERROR
    # Control: the same connection is still served, a valid text is journaled.
    good = '{"jsonrpc": "2.0", "method": "result", "params": {"text": "\\u00e9t\\u00e9"}, "id": 2}'
    assert "digest" in conn.ask(good)["result"]
    assert peer.cell.results == [("agent:estate/sa-1", "été".encode())]
    assert conn.ask(WHOAMI)["result"] == {"lineage": "agent:estate/sa-1"}


def test_an_unexpected_failure_is_an_internal_error_not_a_dead_thread(
    peer: Peer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(lineage: str, data: bytes) -> str:
        raise UnicodeEncodeError("utf-8", "x", 0, 1, "a bug below the door")

    monkeypatch.setattr(peer.cell, "journal_result", broken)
    conn = peer.connect()
    reply = conn.ask('{"jsonrpc": "2.0", "method": "result", "params": {"text": "x"}, "id": 3}')
    assert reply == {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {"code": INTERNAL_ERROR, "message": "the door failed to serve this request"},
    }
    assert conn.ask(WHOAMI)["id"] == 7  # the thread lives on


# -- 2. JSON-RPC 2.0: ids, methods, notifications, batches ---------------------------


@pytest.mark.parametrize(
    "frame",
    [
        '{"jsonrpc": "2.0", "method": "whoami", "id": 1e400}',
        '{"jsonrpc": "2.0", "method": "whoami", "id": -1e400}',
        '{"jsonrpc": "2.0", "method": "whoami", "id": NaN}',
        '{"jsonrpc": "2.0", "method": "whoami", "id": Infinity}',
        '{"jsonrpc": "2.0", "method": "whoami", "id": -Infinity}',
        '{"jsonrpc": "2.0", "method": "whoami", "id": true}',
        '{"jsonrpc": "2.0", "method": "whoami", "id": [1]}',
        '{"jsonrpc": "2.0", "method": "whoami", "id": {"a": 1}}',
    ],
)
def test_an_id_that_is_no_json_rpc_id_is_an_invalid_request(peer: Peer, frame: str) -> None:
    conn = peer.connect()
    conn.send(frame)
    line = conn.reader.readline()
    reply = _strict(line)  # valid JSON: no NaN or Infinity echoed back
    assert reply["error"]["code"] == INVALID_REQUEST, reply
    assert reply["id"] is None


@pytest.mark.parametrize("request_id", ['"abc"', "0", "-12", "1.5", "null", str(10**40)])
def test_a_valid_id_is_echoed(peer: Peer, request_id: str) -> None:
    conn = peer.connect()
    conn.send(f'{{"jsonrpc": "2.0", "method": "whoami", "id": {request_id}}}')
    reply = _strict(conn.reader.readline())
    assert reply["id"] == json.loads(request_id)
    assert reply["result"] == {"lineage": "agent:estate/sa-1"}


@pytest.mark.parametrize(
    "frame",
    [
        '{"jsonrpc": "2.0", "id": 1}',
        '{"jsonrpc": "2.0", "method": 1, "id": 1}',
        '{"jsonrpc": "2.0", "method": null, "id": 1}',
        '{"jsonrpc": "2.0", "method": ["whoami"], "id": 1}',
        '{"jsonrpc": "2.0", "method": "whoami", "params": "bar", "id": 1}',
        '{"jsonrpc": "2.0", "method": "whoami", "params": null, "id": 1}',
        '{"method": "whoami", "id": 1}',
        '{"jsonrpc": "1.0", "method": "whoami", "id": 1}',
    ],
)
def test_a_missing_or_non_string_method_is_an_invalid_request(peer: Peer, frame: str) -> None:
    reply = peer.connect().ask(frame)
    assert reply["error"]["code"] == INVALID_REQUEST, reply
    assert reply["id"] == 1


def test_an_unknown_method_is_method_not_found(peer: Peer) -> None:
    reply = peer.connect().ask('{"jsonrpc": "2.0", "method": "1", "id": 1}')
    assert reply["error"]["code"] == METHOD_NOT_FOUND


def test_a_notification_is_executed_without_a_reply(peer: Peer) -> None:
    conn = peer.connect()
    conn.send('{"jsonrpc": "2.0", "method": "result", "params": {"text": "quiet"}}')
    conn.send('{"jsonrpc": "2.0", "method": "no-such-method"}')  # its error: no reply
    conn.send('{"jsonrpc": "2.0", "method": "result", "params": {"bad": 1}}')
    conn.send(
        '{"jsonrpc": "2.0", "method": "sign", "params": {"tag": "t/v1", "message_hex": "zz"}}'
    )
    # The next reply on the connection is the next request's: nothing came in between.
    assert conn.ask(WHOAMI) == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"lineage": "agent:estate/sa-1"},
    }
    assert peer.cell.results == [("agent:estate/sa-1", b"quiet")]


# The examples of the JSON-RPC 2.0 specification (section 7), verbatim where the door
# has no such method (subtract, sum, update, …: method not found), and with whoami for
# the ones that must succeed. (frame, expected reply or None for no reply)
SPEC: list[tuple[str, Any]] = [
    # rpc call of non-existent method
    (
        '{"jsonrpc": "2.0", "method": "foobar", "id": "1"}',
        {"jsonrpc": "2.0", "error": {"code": -32601}, "id": "1"},
    ),
    # rpc call with invalid JSON
    (
        '{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]',
        {"jsonrpc": "2.0", "error": {"code": -32700}, "id": None},
    ),
    # rpc call with invalid Request object
    (
        '{"jsonrpc": "2.0", "method": 1, "params": "bar"}',
        {"jsonrpc": "2.0", "error": {"code": -32600}, "id": None},
    ),
    # rpc call Batch, invalid JSON
    (
        '[\n  {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},'
        '\n  {"jsonrpc": "2.0", "method"\n]'.replace("\n", " "),
        {"jsonrpc": "2.0", "error": {"code": -32700}, "id": None},
    ),
    # rpc call with an empty Array
    ("[]", {"jsonrpc": "2.0", "error": {"code": -32600}, "id": None}),
    # rpc call with an invalid Batch (but not empty)
    ("[1]", [{"jsonrpc": "2.0", "error": {"code": -32600}, "id": None}]),
    # rpc call with invalid Batch
    ("[1,2,3]", [{"jsonrpc": "2.0", "error": {"code": -32600}, "id": None}] * 3),
    # rpc call Batch
    (
        '[{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},'
        ' {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},'
        ' {"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},'
        ' {"foo": "boo"},'
        ' {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},'
        ' {"jsonrpc": "2.0", "method": "whoami", "id": "9"}]',
        [
            {"jsonrpc": "2.0", "error": {"code": -32601}, "id": "1"},
            {"jsonrpc": "2.0", "error": {"code": -32601}, "id": "2"},
            {"jsonrpc": "2.0", "error": {"code": -32600}, "id": None},
            {"jsonrpc": "2.0", "error": {"code": -32601}, "id": "5"},
            {"jsonrpc": "2.0", "result": {"lineage": "agent:estate/sa-1"}, "id": "9"},
        ],
    ),
    # rpc call Batch (all notifications)
    (
        '[{"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},'
        ' {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}]',
        None,
    ),
    # a Notification
    ('{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}', None),
    ('{"jsonrpc": "2.0", "method": "foobar"}', None),
]


def _shape(reply: Any) -> Any:
    """A reply with each error reduced to its code (messages are the door's own)."""
    if isinstance(reply, list):
        return [_shape(r) for r in reply]
    if "error" in reply:
        return reply | {"error": {"code": reply["error"]["code"]}}
    return reply


@pytest.mark.parametrize(("frame", "expected"), SPEC)
def test_the_specifications_examples(peer: Peer, frame: str, expected: Any) -> None:
    conn = peer.connect()
    conn.send(frame)
    if expected is None:  # no reply: the next reply is the control's
        assert conn.ask(WHOAMI)["id"] == 7
    else:
        assert _shape(_strict(conn.reader.readline())) == expected
        assert conn.ask(WHOAMI)["id"] == 7  # and the connection goes on


def test_a_batch_is_bounded(peer: Peer) -> None:
    conn = peer.connect()
    whoami = {"jsonrpc": "2.0", "method": "whoami", "id": 1}
    over = conn.ask(json.dumps([whoami] * (MAX_BATCH + 1)))
    assert over["error"]["code"] == INVALID_REQUEST
    assert over["id"] is None
    full = conn.ask(json.dumps([whoami] * MAX_BATCH))  # control: the cap itself is served
    assert len(full) == MAX_BATCH
    assert all("result" in r for r in full)


def test_positional_params_are_invalid_params(peer: Peer) -> None:
    reply = peer.connect().ask('{"jsonrpc": "2.0", "method": "result", "params": ["x"], "id": 1}')
    assert reply["error"]["code"] == INVALID_PARAMS


# -- 3. counters and threads belong to the sandbox, not the uid ----------------------


def test_a_later_holder_of_the_uid_does_not_inherit_a_flooders_count(tmp_path: Path) -> None:
    peer = Peer(tmp_path / "door-test.sock", max_requests=5)
    try:
        peer.hold("sbx-flooder", "agent:estate/sa-1")
        flooder = peer.connect()
        for _ in range(5):
            assert "result" in flooder.ask(WHOAMI)
        assert flooder.ask(WHOAMI)["error"]["code"] == OVER_LIMIT  # the flood is capped
        flooder.close()
        peer.end()
        # The pool wraps: the same uid now holds another sandbox with another worker.
        peer.hold("sbx-innocent", "agent:estate/sa-2")
        assert peer.door.requests(UID) == 0
        innocent = peer.connect()
        for _ in range(5):  # its own five, all of them
            assert innocent.ask(WHOAMI)["result"] == {"lineage": "agent:estate/sa-2"}
        assert innocent.ask(WHOAMI)["error"]["code"] == OVER_LIMIT
    finally:
        peer.door.close()


def test_a_later_holder_of_the_uid_gets_its_own_connections(peer: Peer) -> None:
    flooder = [peer.connect() for _ in range(MAX_CONNECTIONS)]
    for conn in flooder:  # each holds a door thread
        assert "result" in conn.ask(WHOAMI)
    over = peer.connect().reply()
    assert over["error"]["code"] == OVER_LIMIT  # the cap, for the flooder
    peer.end()  # its sandbox ends with its connections still open
    assert peer.door.active(UID) == 0  # hung up and drained before the uid is free
    peer.hold("sbx-innocent", "agent:estate/sa-2")
    innocent = [peer.connect() for _ in range(MAX_CONNECTIONS)]
    for conn in innocent:  # all of its own four
        assert conn.ask(WHOAMI)["result"] == {"lineage": "agent:estate/sa-2"}
    for conn in flooder:
        assert conn.reader.readline() == b""


def test_a_connection_does_not_outlive_its_sandbox(peer: Peer) -> None:
    old = peer.connect()
    assert old.ask(WHOAMI)["result"] == {"lineage": "agent:estate/sa-1"}
    with peer.cell.changed:  # the worker ended; its sandbox is not unregistered yet
        peer.cell.by_uid[UID] = "agent:estate/sa-9"  # and the uid holds another
    # The attack: the old connection, kept open, asks as whoever holds the uid now.
    reply = old.ask(WHOAMI)
    assert reply["error"]["code"] == REFUSED
    assert reply["error"]["data"] == {"reason": "worker-gone"}
    assert old.reader.readline() == b""  # and is closed
    assert peer.connect().ask(WHOAMI)["result"] == {"lineage": "agent:estate/sa-9"}  # control


class _Polling:
    """A request that polls the cell until it is told to stop, the way a ``wait``
    queued for its processing slot does (requests.py ``_back_to_processing``)."""

    started = threading.Event()

    def __init__(self, cell: Any, uncharged: Any = None) -> None:
        self.cell = cell

    def wait(self, lineage: str, children: tuple[str, ...], timeout_s: float) -> Any:
        with self.cell.changed:
            _Polling.started.set()
            while True:
                self.cell.changed.wait(0.05)


def _door_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"door-conn-{UID}"]


WAIT = (
    '{"jsonrpc": "2.0", "method": "wait", "params": {"children": ["agent:estate/sa-1/x"]}, "id": 1}'
)


@pytest.mark.parametrize("how", ["worker-ends", "door-closes"])
def test_a_polling_request_ends_with_its_worker_or_the_door(
    peer: Peer, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setattr(door_module, "WorkerRequests", _Polling)
    _Polling.started.clear()
    before = set(_door_threads())
    conn = peer.connect()
    conn.send(WAIT)
    assert _Polling.started.wait(30)
    (thread,) = set(_door_threads()) - before
    thread.join(0.3)
    assert thread.is_alive()  # control: while its worker lives, the request waits on
    if how == "worker-ends":
        with peer.cell.changed:  # the waiter dies while queued (its sandbox not yet gone)
            peer.cell.by_uid.pop(UID)
    else:
        peer.door.close()
    thread.join(30)
    assert not thread.is_alive()
    if how == "worker-ends":
        reply = conn.reply()  # it was answered, not abandoned
        assert reply["error"]["data"] == {"reason": "worker-gone"}
    assert peer.door.connections() == 0


def test_unregistering_a_sandbox_hangs_up_its_idle_connections(peer: Peer) -> None:
    idle = peer.connect()
    assert "result" in idle.ask(WHOAMI)
    threads = _door_threads()
    assert peer.door.connections() == 1
    peer.end()
    assert idle.reader.readline() == b""  # hung up, not left to the hour's idle timeout
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    assert peer.door.connections() == 0
