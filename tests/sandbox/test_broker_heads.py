"""Request heads are parsed by h11, not by hand: a bad port is a 400 and a record (not a
dead broker thread), an IPv6 grant matches a ``[::1]:port`` authority, and bytes sent
right after a CONNECT head are forwarded. Real sandboxes throughout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from charter.core import Budget
from charter.sandbox import EgressAttempted, EgressBroker, EgressGrant, Launcher, MemorySink

from ._egress_support import CLIENT, PAYLOAD, Server
from ._support import out, sandboxed

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=10MB")

# Inside the sandbox: send argv[1] (latin-1: any byte) as a whole head, print the status;
# then CONNECT to 127.0.0.1:argv[2] on a new connection of the same sandbox and print the
# status and the bytes that came through.
BAD_THEN_GOOD = """
import os, socket, sys
def connect(head):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(os.environ["CHARTER_EGRESS_SOCKET"])
    s.sendall(head)
    data = b""
    while b"\\r\\n\\r\\n" not in data and (chunk := s.recv(4096)):
        data += chunk
    status = data.split(b" ")[1].decode() if data else "none"
    n = 0
    if status == "200":
        s.sendall(b"go\\n")
        while chunk := s.recv(65536):
            n += len(chunk)
    return status, n
print(connect(sys.argv[1].encode("latin-1"))[0])
good = f"127.0.0.1:{sys.argv[2]}"
print(*connect(f"CONNECT {good} HTTP/1.1\\r\\nHost: {good}\\r\\n\\r\\n".encode()))
"""

# Inside the sandbox: CONNECT to 127.0.0.1:argv[1]; with argv[2] == "early", the line the
# server waits for is sent in the same write as the head (before any answer); otherwise
# nothing more is sent. Read the answer and what follows for up to 3 s of silence.
EARLY = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["CHARTER_EGRESS_SOCKET"])
t = f"127.0.0.1:{sys.argv[1]}"
extra = b"go\\n" if sys.argv[2] == "early" else b""
s.sendall(f"CONNECT {t} HTTP/1.1\\r\\nHost: {t}\\r\\n\\r\\n".encode() + extra)
s.settimeout(3)
data, end = b"", "EOF"
try:
    while chunk := s.recv(65536):
        data += chunk
except TimeoutError:
    end = "silence"
head, _, rest = data.partition(b"\\r\\n\\r\\n")
print(head.split(b" ")[1].decode(), len(rest), end)
"""


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def broker(state_dir: Path) -> Iterator[EgressBroker]:
    with EgressBroker(state_dir / "egress-heads.sock") as b:
        yield b


@pytest.fixture
def launcher(state_dir: Path, sink: MemorySink, broker: EgressBroker) -> Launcher:
    return Launcher(sink, state_dir=state_dir, egress=broker)


def test_a_non_ascii_digit_in_a_port_is_a_400_and_a_record(
    launcher: Launcher, sink: MemorySink, server: Server
) -> None:
    # The attack: "\xb2" is "²", which str.isdigit() accepts and int() refuses; a
    # hand parser guarded by isdigit() dies on it (the control: it would).
    port = "44\xb2"
    assert port.isdigit()
    with pytest.raises(ValueError, match="invalid literal"):
        int(port)
    grant = EgressGrant(destinations=(f"127.0.0.1:{server.port}",))
    head = f"CONNECT a.test:{port} HTTP/1.1\r\nHost: a.test\r\n\r\n"
    o = sandboxed(launcher, B, BAD_THEN_GOOD, head, str(server.port), grant=grant)
    # Answered 400, and the broker goes on serving the same sandbox.
    assert out(o).splitlines() == ["400", f"200 {PAYLOAD}"]
    records = [
        (e.destination, e.allowed, e.reason)
        for e in sink.events
        if isinstance(e, EgressAttempted) and e.sandbox_id == o.sandbox_id
    ]
    assert records == [
        ("?", False, "malformed proxy request"),
        (f"127.0.0.1:{server.port}", True, "closed"),
    ]


def test_an_ipv6_grant_matches_a_bracketed_authority(launcher: Launcher, sink: MemorySink) -> None:
    server = Server("::1")
    try:
        target = f"[::1]:{server.port}"
        # The attack on the old parser: a grant of another IPv6 address must not match.
        other = sandboxed(launcher, B, CLIENT, target,
                          grant=EgressGrant(destinations=(f"[::2]:{server.port}",)))  # fmt: skip
        assert out(other).split() == ["403", "0"]
        assert server.accepted == 0
        # Control: the IPv6 grant of this address matches and the tunnel carries data.
        o = sandboxed(launcher, B, CLIENT, target, grant=EgressGrant(destinations=(target,)))
        assert out(o).split() == ["200", str(PAYLOAD)]
        assert server.accepted == 1
        records = [e for e in sink.events if isinstance(e, EgressAttempted)]
        (record,) = [e for e in records if e.sandbox_id == o.sandbox_id]
        assert (record.destination, record.allowed) == (target, True)
    finally:
        server.close()


def test_bytes_right_after_a_connect_head_are_forwarded(launcher: Launcher, server: Server) -> None:
    grant = EgressGrant(destinations=(f"127.0.0.1:{server.port}",))
    # The line the server waits for travels in the same write as the head: forwarded,
    # the server answers with the whole payload.
    early = sandboxed(launcher, B, EARLY, str(server.port), "early", grant=grant)
    assert out(early).split() == ["200", str(PAYLOAD), "EOF"]
    # Control: without that line the server sends nothing (so the payload above came
    # only because the early bytes reached it).
    silent = sandboxed(launcher, B, EARLY, str(server.port), "none", grant=grant)
    assert out(silent).split() == ["200", "0", "silence"]
