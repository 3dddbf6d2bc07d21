"""The egress broker: the only way out; grant destinations and byte budget enforced,
identity by host uid, every attempt recorded."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from charter.core import Budget
from charter.sandbox import (
    EgressAttempted,
    EgressBroker,
    EgressGrant,
    Launcher,
    MemorySink,
    SandboxLeased,
)
from charter.sandbox import egress as egress_module
from charter.sandbox._http import parse_head

from ._brokers import HERE, Appended
from ._support import on_host, out, sandboxed

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=10MB")
PAYLOAD = 1024 * 1024

# Inside the sandbox: a CONNECT tunnel through the broker socket, then read to EOF. The
# argument is a port on 127.0.0.1 or a host:port asked for by name.
CLIENT = """
import os, socket, sys
target = sys.argv[1] if ":" in sys.argv[1] else f"127.0.0.1:{sys.argv[1]}"
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["CHARTER_EGRESS_SOCKET"])
s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
head = b""
while b"\\r\\n\\r\\n" not in head:
    chunk = s.recv(1)
    if not chunk:
        break
    head += chunk
status = head.split(b" ")[1].decode() if head else "none"
n = 0
try:
    if status == "200":
        s.sendall(b"go\\n")
        while data := s.recv(65536):
            n += len(data)
except OSError:
    pass
print(status, n)
"""

# On the host, as any uid: connect, send argv[2] (possibly nothing), read to the end;
# print the reply's first line and how it ended (EOF, or the error that ended it).
ASK = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
try:
    s.sendall(sys.argv[2].encode())
except OSError:
    pass
data, end = b"", "EOF"
try:
    while chunk := s.recv(4096):
        data += chunk
except OSError as e:
    end = type(e).__name__
print((data.decode("latin-1").splitlines() or ["-"])[0], end, sep="|")
"""


class _Server:
    """A host TCP server on loopback that sends PAYLOAD bytes after reading a line."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(16)
                    conn.sendall(b"x" * PAYLOAD)
                except OSError:
                    pass


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.sock.close()


@pytest.fixture
def broker(state_dir: Path) -> Iterator[EgressBroker]:
    with EgressBroker(state_dir / "egress.sock") as b:
        yield b


@pytest.fixture
def egress_launcher(state_dir: Path, sink: MemorySink, broker: EgressBroker) -> Launcher:
    return Launcher(sink, state_dir=state_dir, egress=broker)


def _attempts(sink: MemorySink) -> list[EgressAttempted]:
    return [e for e in sink.events if isinstance(e, EgressAttempted)]


def test_destination_outside_the_grant_is_refused(
    egress_launcher: Launcher, sink: MemorySink, server: _Server
) -> None:
    other = _Server()
    try:
        grant = EgressGrant(destinations=(f"127.0.0.1:{server.port}",), byte_budget=10 * PAYLOAD)
        denied = sandboxed(egress_launcher, B, CLIENT, str(other.port), grant=grant)
        assert out(denied).split() == ["403", "0"]
        # Control: the granted destination is reached through the same broker.
        allowed = sandboxed(egress_launcher, B, CLIENT, str(server.port), grant=grant)
        assert out(allowed).split() == ["200", str(PAYLOAD)]
    finally:
        other.sock.close()
    first, second = _attempts(sink)
    assert (first.destination, first.allowed) == (f"127.0.0.1:{other.port}", False)
    assert first.reason == "destination not in the grant"
    assert (second.destination, second.allowed) == (f"127.0.0.1:{server.port}", True)
    assert second.bytes_in == PAYLOAD
    # Identified by host uid: the attempt names the uid the lease was journaled with.
    # The gate's probe canary may be journaled to the same sink: take this sandbox's.
    leases = [
        e
        for e in sink.events
        if type(e).__name__ == "SandboxLeased" and e.sandbox_id == first.sandbox_id  # type: ignore[attr-defined]
    ]
    assert leases
    assert first.host_uid == leases[0].host_uid  # type: ignore[attr-defined]


def test_egress_beyond_the_byte_budget_is_cut(
    egress_launcher: Launcher, sink: MemorySink, server: _Server
) -> None:
    dest = (f"127.0.0.1:{server.port}",)
    small = sandboxed(egress_launcher, B, CLIENT, str(server.port),
                      grant=EgressGrant(destinations=dest, byte_budget=64 * 1024))  # fmt: skip
    status, received = out(small).split()
    assert status == "200"
    assert int(received) < 64 * 1024
    assert small.usage.egress_bytes == 64 * 1024
    cut = _attempts(sink)[-1]
    assert not cut.allowed
    assert cut.reason == "egress byte budget exhausted"
    # Control: with budget to spare the same transfer completes.
    big = sandboxed(egress_launcher, B, CLIENT, str(server.port),
                    grant=EgressGrant(destinations=dest, byte_budget=4 * PAYLOAD))  # fmt: skip
    assert out(big).split() == ["200", str(PAYLOAD)]


@pytest.mark.parametrize("path", ["cold", "warm"])
def test_the_budget_caps_egress_when_the_grant_does_not(
    egress_launcher: Launcher, broker: EgressBroker, sink: MemorySink, server: _Server,
    scratch: Path, state_dir: Path, path: str,
) -> None:  # fmt: skip
    """The broker enforces the spec's egress bytes: a grant naming only destinations
    gets the budget's bytes, on the cold path and in the warm pool alike."""
    from charter.sandbox import WarmPool

    from ._support import PY

    grant = EgressGrant(destinations=(f"127.0.0.1:{server.port}",))
    small = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=64KiB")

    def run(budget: Budget) -> tuple[list[str], int]:
        if path == "cold":
            o = sandboxed(egress_launcher, budget, CLIENT, str(server.port), grant=grant)
        else:
            with WarmPool(scratch, budget, 1, sink=sink, egress=broker,
                          state_dir=state_dir) as pool:  # fmt: skip
                slot = pool.lease(grant)
                o = slot.run([PY, "-I", "-c", CLIENT, str(server.port)])
                pool.release(slot, refill=False)
        return out(o).split(), o.usage.egress_bytes

    (status, received), used = run(small)
    assert status == "200"
    assert int(received) < 64 * 1024
    assert used == 64 * 1024
    assert _attempts(sink)[-1].reason == "egress byte budget exhausted"
    # Control: with the 10 MB budget the same grant moves the whole payload.
    assert run(B)[0] == ["200", str(PAYLOAD)]


def test_no_grant_means_no_egress(egress_launcher: Launcher, server: _Server) -> None:
    o = sandboxed(egress_launcher, B, CLIENT, str(server.port))
    assert out(o).split() == ["403", "0"]


def test_an_unregistered_peer_is_refused(
    broker: EgressBroker, server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Identity is the peer's host uid: a process whose uid holds no lease gets nothing,
    and is refused on accept, before a thread is started or a byte is read from it."""
    # A started thread would wait a minute for the head; the client gives up after 5 s.
    monkeypatch.setattr(egress_module, "_HEAD_TIMEOUT", 60.0)
    served: list[int] = []
    serve = broker._server.handler

    def counted(conn: socket.socket, uid: int) -> None:
        served.append(uid)
        serve(conn, uid)

    monkeypatch.setattr(broker._server, "handler", counted)
    r = on_host(ASK, str(broker.path), "", user=60995)  # says nothing at all
    assert r.stdout.strip() == "HTTP/1.1 403 unknown sandbox|EOF"
    assert served == []
    assert (60995, "?") in broker.unknown_attempts
    # Control: once the uid is registered, the same kind of peer gets a thread and a tunnel.
    code = CLIENT.replace('os.environ["CHARTER_EGRESS_SOCKET"]', repr(str(broker.path)))
    broker.register(60995, "sbx-known", EgressGrant(destinations=(f"127.0.0.1:{server.port}",)),
                    byte_cap=10 * PAYLOAD, cgroup=HERE, journal=Appended())  # fmt: skip
    try:
        assert on_host(code, str(server.port), user=60995).stdout.split() == ["200", str(PAYLOAD)]
        assert served == [60995]
    finally:
        broker.unregister(60995)


def test_idle_connections_are_closed(
    broker: EgressBroker, server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that never sends its head, and a tunnel that carries nothing, are closed
    (and their threads end) instead of being held forever."""
    monkeypatch.setattr(egress_module, "_HEAD_TIMEOUT", 1.0)
    monkeypatch.setattr(egress_module, "_IDLE_TIMEOUT", 1.0)
    uid, path = 60993, str(broker.path)
    broker.register(uid, "sbx-idle", EgressGrant(destinations=(f"127.0.0.1:{server.port}",)),
                    byte_cap=10 * PAYLOAD, cgroup=HERE, journal=Appended())  # fmt: skip
    try:
        # Silent after connecting: dropped after the head timeout (the client waits 5 s).
        r = on_host(ASK, path, "", user=uid)
        assert r.stdout.strip() == "HTTP/1.1 400 malformed proxy request|EOF"
        # A tunnel nobody speaks on (the server waits for a line that never comes).
        connect = f"CONNECT 127.0.0.1:{server.port} HTTP/1.1\r\nHost: x\r\n\r\n"
        r = on_host(ASK, path, connect, user=uid)
        assert r.stdout.strip() == "HTTP/1.1 200 Connection established|EOF"
        idle = broker.attempts(uid)[-1]
        assert (idle.allowed, idle.reason) == (True, "idle timeout")
        # Control: under the same timeouts a tunnel that moves bytes runs to the end.
        code = CLIENT.replace('os.environ["CHARTER_EGRESS_SOCKET"]', repr(path))
        assert on_host(code, str(server.port), user=uid).stdout.split() == ["200", str(PAYLOAD)]
        assert broker.attempts(uid)[-1].reason == "closed"
        assert broker.active(uid) == 0
    finally:
        broker.unregister(uid)


def test_curl_reaches_the_broker_as_an_http_proxy(egress_launcher: Launcher) -> None:
    import http.server
    import socketserver

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"hello from the host\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with socketserver.TCPServer(("127.0.0.1", 0), Hello) as httpd:
        port = httpd.server_address[1]
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        curl = f"curl -sS --unix-socket $CHARTER_EGRESS_SOCKET http://127.0.0.1:{port}/"
        grant = EgressGrant(destinations=(f"127.0.0.1:{port}",), byte_budget=10_000)
        o = egress_launcher.run(B, ["/bin/sh", "-c", curl], capture=True, grant=grant,
                                stdin=subprocess.DEVNULL)  # fmt: skip
        httpd.shutdown()
    assert o.stdout == b"hello from the host\n"


def test_parse_forms() -> None:
    connect = parse_head(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n")
    assert connect is not None
    assert (connect.host, connect.port, connect.tunnel, connect.forward) == (
        "example.com", 443, True, b""
    )  # fmt: skip
    absolute = parse_head(b"GET http://a.b:8080/x HTTP/1.1\r\nHost: a.b\r\n\r\n")
    assert absolute is not None
    assert (absolute.host, absolute.port) == ("a.b", 8080)
    assert absolute.forward.startswith(b"GET /x HTTP/1.1")
    origin = parse_head(b"GET /x HTTP/1.1\r\nHost: a.b\r\n\r\n")
    assert origin is not None
    assert (origin.host, origin.port) == ("a.b", 80)
    assert parse_head(b"nonsense\r\n\r\n") is None
    grant = EgressGrant(destinations=("example.com", "10.0.0.1:8443", "*.example.net"))
    assert grant.allows("example.com", 443)
    assert grant.allows("Example.COM.", 80)  # the asked-for host is normalised
    assert not grant.allows("example.com", 22)
    assert grant.allows("10.0.0.1", 8443)
    assert not grant.allows("10.0.0.1", 443)
    assert not grant.allows("evil.example.com", 443)
    assert grant.allows("a.b.example.net", 443)
    assert not grant.allows("example.net", 443)  # a pattern admits only what is below it


@pytest.mark.parametrize(
    "entry", ["not a host!!", "Example.com", "http://example.com", "*", "example.com/x",
              "api.example.com:0", "api.example.com:65536", "a.*.example.com"],
)  # fmt: skip
def test_an_invalid_destination_is_refused_when_the_grant_is_made(entry: str) -> None:
    with pytest.raises(ValidationError, match="egress destination"):
        EgressGrant(destinations=("api.example.com", entry))
    # Control: the same grant without the bad entry is made.
    assert EgressGrant(destinations=("api.example.com",)).destinations == ("api.example.com",)


@pytest.fixture
def example_names(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolve every name under example.com and example.org to the loopback test server
    (on the host, where the broker resolves; the sandbox cannot resolve anything)."""
    real = socket.getaddrinfo

    def resolve(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        if isinstance(host, str) and host.endswith(("example.com", "example.org")):
            return real("127.0.0.1", server.port, *args, **kw)
        return real(host, port, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)


@pytest.mark.usefixtures("example_names")
def test_a_wildcard_grant_reaches_a_subdomain_through_the_broker(
    egress_launcher: Launcher, sink: MemorySink, server: _Server
) -> None:
    """``*.example.com`` in the grant's own vocabulary: the broker lets a real sandbox
    reach api.example.com (ports 80 and 443) and nothing outside the pattern. (The names
    resolve to the loopback test server, so the grant grants that address too: see
    test_broker_addresses.py for what happens without it.)"""
    names = ("*.example.com", f"127.0.0.1:{server.port}")
    grant = EgressGrant(destinations=names, byte_budget=10 * PAYLOAD)
    allowed = sandboxed(egress_launcher, B, CLIENT, "api.example.com:443", grant=grant)
    assert out(allowed).split() == ["200", str(PAYLOAD)]
    # The attacks, each resolvable to the same server: another domain, the pattern's
    # apex (not below it) and a port the pattern does not admit.
    for target in ("example.org:443", "example.com:443", "api.example.com:8443"):
        denied = sandboxed(egress_launcher, B, CLIENT, target, grant=grant)
        assert out(denied).split() == ["403", "0"], target
    attempts = [(a.destination, a.allowed, a.reason) for a in _attempts(sink)]
    assert attempts == [
        ("api.example.com:443", True, "closed"),
        ("example.org:443", False, "destination not in the grant"),
        ("example.com:443", False, "destination not in the grant"),
        ("api.example.com:8443", False, "destination not in the grant"),
    ]
    leases = [e for e in sink.events if isinstance(e, SandboxLeased)]
    assert [lease.egress for lease in leases] == [names] * 4
