"""The egress broker checks the address it connects to, not only the name: an allowed
name that resolves (or is rebound) to loopback, link-local, private or other non-global
space is refused unless that address is granted too. Real sandboxes, real resolution of
``localhost``; other names through the broker's resolver hook (the sandbox asks the
broker, which asks the hook where it would ask the host's resolver)."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from charter.core import Budget
from charter.sandbox import (
    EgressAttempted,
    EgressBroker,
    EgressGrant,
    EgressOpened,
    Launcher,
    MemorySink,
)
from charter.sandbox import egress as egress_module

from ._egress_support import CLIENT, PAYLOAD, Server
from ._support import out, sandboxed

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=20s,cpu=20s,mem=64MiB,egress=10MB")


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def _opened(sink: MemorySink, sandbox_id: str) -> list[EgressOpened]:
    return [e for e in sink.events if isinstance(e, EgressOpened) and e.sandbox_id == sandbox_id]


def _reasons(sink: MemorySink, sandbox_id: str) -> list[str]:
    return [
        e.reason
        for e in sink.events
        if isinstance(e, EgressAttempted) and e.sandbox_id == sandbox_id
    ]


def test_an_allowed_name_that_resolves_to_loopback_is_refused(
    state_dir: Path, sink: MemorySink, server: Server
) -> None:
    """``localhost`` really resolves to 127.0.0.1 (the host's resolver): granting the
    name does not grant the loopback address behind it."""
    with EgressBroker(state_dir / "egress-lo.sock") as broker:
        launcher = Launcher(sink, state_dir=state_dir, egress=broker)
        target = f"localhost:{server.port}"
        name_only = EgressGrant(destinations=(target,))
        refused = sandboxed(launcher, B, CLIENT, target, grant=name_only)
        assert out(refused).split() == ["403", "0"]
        assert _reasons(sink, refused.sandbox_id) == ["non-global address not granted"]
        assert _opened(sink, refused.sandbox_id) == []
        assert server.accepted == 0
        # Control: with the address granted too, the same connection goes through, and
        # what was connected to is journaled.
        both = EgressGrant(destinations=(target, f"127.0.0.1:{server.port}"))
        allowed = sandboxed(launcher, B, CLIENT, target, grant=both)
        assert out(allowed).split() == ["200", str(PAYLOAD)]
        (opened,) = _opened(sink, allowed.sandbox_id)
        assert (opened.destination, opened.address) == (target, "127.0.0.1")
        assert server.accepted == 1


class _Resolver:
    """A resolver hook: ``answers[name]`` is a list of address lists, one per lookup
    (the last repeated); every other name is unknown. Counts lookups per name."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.lookups: dict[str, int] = {}

    def __call__(self, host: str, port: int) -> Sequence[tuple[Any, ...]]:
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        n = self.lookups.get(host, 0)
        self.lookups[host] = n + 1
        batches = self.answers[host]
        out: list[tuple[Any, ...]] = []
        for address in batches[min(n, len(batches) - 1)]:
            if ":" in address:
                out.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                out.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return out


@pytest.mark.parametrize(
    ("address", "granted"),
    [
        ("169.254.169.254", "169.254.169.254"),  # cloud metadata
        ("10.1.2.3", "10.0.0.0/8"),  # RFC 1918, granted as a range
        ("192.168.7.7", "192.168.7.7"),
        ("100.64.0.1", "100.64.0.0/10"),  # shared address space
        ("0.0.0.0", "0.0.0.0"),  # unspecified
        ("224.0.0.1", "224.0.0.1"),  # multicast
        ("fe80::1", "[fe80::/10]"),  # IPv6 link-local
        ("fd00::7", "[fc00::/7]"),  # IPv6 unique local
        ("2002:a9fe:a9fe::1", "[2002::/16]"),  # 6to4 (of cloud metadata): is_global says yes
        ("fec0::1", "[fec0::/10]"),  # IPv6 site-local: is_global says yes
        ("::ffff:127.0.0.1", "127.0.0.1"),  # loopback mapped into IPv6
    ],
)
def test_non_global_addresses_are_refused_unless_granted(
    state_dir: Path,
    sink: MemorySink,
    monkeypatch: pytest.MonkeyPatch,
    address: str,
    granted: str,
) -> None:
    monkeypatch.setattr(egress_module, "_CONNECT_TIMEOUT", 1.0)
    resolver = _Resolver({"svc.test": [[address]]})
    with EgressBroker(state_dir / "egress-addr.sock", resolver=resolver) as broker:
        launcher = Launcher(sink, state_dir=state_dir, egress=broker)
        refused = sandboxed(launcher, B, CLIENT, "svc.test:443",
                            grant=EgressGrant(destinations=("svc.test",)))  # fmt: skip
        assert out(refused).split() == ["403", "0"]
        assert _reasons(sink, refused.sandbox_id) == ["non-global address not granted"]
        assert _opened(sink, refused.sandbox_id) == []  # nothing was opened
        # Control: with the address (or its range) granted, the broker goes on to open a
        # connection to exactly that address (whether anything answers there or not).
        grant = EgressGrant(destinations=("svc.test", f"{granted}:443"))
        tried = sandboxed(launcher, B, CLIENT, "svc.test:443", grant=grant)
        (opened,) = _opened(sink, tried.sandbox_id)
        assert (opened.destination, opened.address) == ("svc.test:443", address)
        assert "non-global address not granted" not in _reasons(sink, tried.sandbox_id)


def test_dns_rebinding_cannot_reach_loopback(
    state_dir: Path, sink: MemorySink, server: Server
) -> None:
    """The allowed name first resolves to a public address, then to loopback (a
    rebinding DNS server). The broker resolves once and connects to the address it
    checked, so the loopback server is never reached."""
    public = "2001:4860:4860::8888"  # global (no route from here: nothing leaves the host)
    resolver = _Resolver({"rebind.test": [[public], ["127.0.0.1"]]})
    target = f"rebind.test:{server.port}"
    with EgressBroker(state_dir / "egress-rebind.sock", resolver=resolver) as broker:
        launcher = Launcher(sink, state_dir=state_dir, egress=broker)
        o = sandboxed(launcher, B, CLIENT, target, grant=EgressGrant(destinations=(target,)))
        assert resolver.lookups == {"rebind.test": 1}  # resolved once
        (opened,) = _opened(sink, o.sandbox_id)
        assert opened.address == public  # the address checked is the one connected to
        assert server.accepted == 0
    # Control: the rebinding server's next answer is the loopback server, and it is
    # reachable: a proxy that looked the name up again to connect would have got there.
    (_, _, _, _, sockaddr), *_ = resolver("rebind.test", server.port)
    with socket.create_connection(sockaddr, timeout=5) as s:
        s.sendall(b"go\n")
        assert s.recv(1) == b"x"
    assert server.accepted == 1


@pytest.mark.parametrize(
    "entry", ["::1", "[::1", "[10.0.0.1]", "10.0.0.1/8", "[::1]x", "[::1]:0", "[fe80::1%eth0]",
              "10.0.0.0/33", "1.2.3.4:65536", "[::1]:44\xb2"],
)  # fmt: skip
def test_a_malformed_address_entry_is_refused(entry: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="egress destination"):
        EgressGrant(destinations=(entry,))
    # Control: the well-formed address entries of the vocabulary are accepted.
    good = ("10.0.0.7:8443", "10.0.0.0/8", "[::1]:443", "[fd00::/8]", "[::1]")
    assert EgressGrant(destinations=good).destinations == good


def test_address_entries_admit_and_cover_by_value() -> None:
    from charter.core.destination import covers

    grant = EgressGrant(destinations=("[::1]:443", "10.0.0.0/8"))
    assert grant.allows("::1", 443)
    assert grant.allows("[0:0::1]", 443)  # the same address, written otherwise
    assert not grant.allows("::2", 443)
    assert grant.allows("10.9.8.7", 80)
    assert not grant.allows("11.0.0.1", 80)
    assert not grant.allows("ten.example", 80)  # an address entry admits no name
    assert covers("10.0.0.0/8", "10.1.0.0/16")
    assert covers("[::/0]:443", "[::1]:443")
    assert not covers("10.1.0.0/16", "10.0.0.0/8")  # a narrower range covers no wider one
    assert not covers("10.0.0.0/8", "ten.example")  # names and addresses never cover
    assert not covers("*.example", "10.0.0.1")
