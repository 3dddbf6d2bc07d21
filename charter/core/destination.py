"""Egress destinations: the one vocabulary the grant's egress axis and the egress broker
both speak.

An entry is a host pattern, or an address or address range, and an optional port:

| entry                   | admits                                            |
|-------------------------|---------------------------------------------------|
| ``api.example.com``     | that host, on ports 80 and 443                    |
| ``*.example.com``       | every host strictly below example.com, 80 and 443 |
| ``api.example.com:8443``| that host, on port 8443 only                      |
| ``*.example.com:8443``  | every host below example.com, on port 8443 only   |
| ``10.0.0.7:8443``       | that IPv4 address, on port 8443 only              |
| ``10.0.0.0/8``          | every address of that range, on 80 and 443        |
| ``[::1]:8443``          | that IPv6 address (always in brackets), 8443 only |
| ``[fd00::/8]``          | every address of that IPv6 range, on 80 and 443   |

Host labels are lower-case DNS labels; a ``*`` is allowed only as the whole first label,
and a name's last label is never all digits (``127.1`` and ``010.0.0.1`` are refused:
resolvers read them as addresses; write an address as an address).
Schemes, paths, a bare ``*``, upper case, an unbracketed IPv6 address and a range with
host bits set are refused, so every entry has one meaning.

Names and addresses are checked at two moments. A name entry admits a connection by the
name the sandbox asked for (:func:`admits`); the broker then resolves that name once and
connects only to an address that is global (:func:`is_global`) or that an address entry
grants (:func:`grants_address`): an allowed name that resolves, or is rebound, to
loopback, link-local (cloud metadata), private or other non-global space is refused
unless that address is granted too. An address entry admits an address literal asked for
directly, and grants that address whatever name resolved to it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator

from charter.core.errors import AxisValueError

__all__ = [
    "DEFAULT_PORTS",
    "Destination",
    "IPAddress",
    "admits",
    "check_destination",
    "covers",
    "grants_address",
    "is_global",
    "split",
]

DEFAULT_PORTS = frozenset({80, 443})
"""The ports an entry without a port admits (HTTP and HTTPS)."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_MAX_HOST = 253
_PORT = re.compile(r"[1-9][0-9]{0,4}")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def split(entry: str) -> tuple[str, frozenset[int] | None]:
    """An entry as (host pattern, its port set, or None for the default ports). An IPv6
    entry's pattern keeps its brackets (``[::1]``)."""
    if entry.startswith("["):
        inside, _, after = entry.partition("]")
        port = after[1:] if after.startswith(":") else ""
        return inside + "]", (frozenset({int(port)}) if port else None)
    host, sep, port = entry.rpartition(":")
    if not sep:
        return entry, None
    return host, frozenset({int(port)})


def _network(pattern: str) -> _Network | None:
    """The addresses an address entry's pattern stands for; None for a name pattern.
    Raises ValueError for a bracketed pattern that is not an IPv6 address or range."""
    if pattern.startswith("["):
        if "%" in pattern:
            raise ValueError("a scoped IPv6 address names no one host")
        net = ipaddress.ip_network(pattern[1:-1], strict=True)
        if net.version != 6:
            raise ValueError("only IPv6 goes in brackets")
        return net
    if not re.fullmatch(r"[0-9./]+", pattern) or not re.search(r"[0-9]$", pattern):
        return None
    try:
        return ipaddress.IPv4Network(pattern, strict=True)
    except ValueError:
        if "/" in pattern:
            raise
        return None  # all digits and dots but no address (``1.2.3``): a name


def _bad(entry: str) -> AxisValueError:
    return AxisValueError(
        f"egress destination {entry[:80]!r}: write an exact host (api.example.com), "
        "a pattern for its subdomains (*.example.com), an address or range (10.0.0.7, "
        "10.0.0.0/8, [::1], [fd00::/8]), optionally with a port (api.example.com:8443, "
        "[::1]:8443): lower-case letters, digits and '-' in dot-separated labels; no "
        "scheme, path or bare '*'"
    )


def check_destination(entry: str) -> str:
    """Validate an entry (see the module table); return it unchanged."""
    if entry.startswith("["):
        inside, close, after = entry.partition("]")
        port = after[1:] if after.startswith(":") else None
        ok = bool(close) and (after == "" or port is not None)
        try:
            ok = ok and _network(inside + "]") is not None
        except ValueError:
            ok = False
        if not ok or (port is not None and not _port_ok(port)):
            raise _bad(entry)
        return entry
    host, sep, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
    try:
        if _network(host) is not None:
            if sep and not _port_ok(port):
                raise _bad(entry)
            return entry
    except ValueError as e:
        raise _bad(entry) from e
    bare = host[2:] if host.startswith("*.") else host
    labels = bare.split(".")
    if (
        not bare
        or len(bare) > _MAX_HOST
        or not all(_LABEL.fullmatch(x) for x in labels)
        # A name's last label is never all digits (RFC 3696 §2): resolvers read such a
        # "name" as an address (127.1 is 127.0.0.1, 010.0.0.1 is octal), and a pattern
        # such as *.0.1 would admit address literals asked for by a sandbox.
        or labels[-1].isdigit()
        or (sep and not _port_ok(port))
    ):
        raise _bad(entry)
    return entry


def _port_ok(port: str) -> bool:
    return _PORT.fullmatch(port) is not None and int(port) <= 65535


def _after(value: str) -> str:
    try:
        return check_destination(value)
    except AxisValueError as e:
        raise ValueError(str(e)) from e


Destination = Annotated[str, AfterValidator(_after)]


def _host_covers(wider: str, narrower: str) -> bool:
    # An exact host admits itself; "*.d" admits every host strictly below d (not d
    # itself), at any depth, so it covers "*.d", "x.d" and "*.x.d".
    if wider.startswith("*."):
        suffix = wider[1:]  # ".d"
        inner = narrower[2:] if narrower.startswith("*.") else narrower
        return narrower == wider or inner.endswith(suffix)
    return narrower == wider


def covers(wider: str, narrower: str) -> bool:
    """True when every (host, port) that ``narrower`` admits is admitted by ``wider``.
    An address entry covers only address entries inside its range, a name entry only
    name entries."""
    w_host, w_ports = split(wider)
    n_host, n_ports = split(narrower)
    ports_ok = (n_ports or DEFAULT_PORTS) <= (w_ports or DEFAULT_PORTS)
    w_net, n_net = _network(w_host), _network(n_host)
    if w_net is not None or n_net is not None:
        return (
            ports_ok
            and w_net is not None
            and n_net is not None
            and n_net.version == w_net.version
            and n_net.subnet_of(w_net)  # type: ignore[arg-type]
        )
    return ports_ok and _host_covers(w_host, n_host)


def _address(host: str) -> IPAddress | None:
    """``host`` as an address when it is an address literal (IPv6 with or without its
    brackets), else None."""
    try:
        return ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        return None


def admits(entry: str, host: str, port: int) -> bool:
    """True when ``entry`` lets a connection to ``host:port`` through, by the name (or
    address literal) asked for. ``host`` is normalised (lower case, no trailing dot)."""
    pattern, ports = split(entry)
    if port not in (ports or DEFAULT_PORTS):
        return False
    net = _network(pattern)
    if net is not None:
        address = _address(host)
        return address is not None and address in net
    name = host.lower().rstrip(".")
    if pattern.startswith("*."):
        return name.endswith(pattern[1:]) and len(name) > len(pattern) - 1
    return name == pattern


def grants_address(entry: str, address: IPAddress, port: int) -> bool:
    """True when ``entry`` is an address entry that grants ``address`` on ``port``."""
    pattern, ports = split(entry)
    net = _network(pattern)
    return net is not None and port in (ports or DEFAULT_PORTS) and _unmapped(address) in net


def _unmapped(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_global(address: IPAddress) -> bool:
    """True for an address on the public internet: not loopback, link-local (cloud
    metadata at 169.254.169.254, fe80::/10), private (RFC 1918, fc00::/7), shared
    (100.64/10), unspecified, multicast, reserved or documentation space. IPv4 mapped
    into IPv6 or behind NAT64 (64:ff9b::/96) is judged as the IPv4 address it carries."""
    address = _unmapped(address)
    if isinstance(address, ipaddress.IPv6Address) and address in _NAT64:
        address = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.is_global and not (
        address.is_multicast
        or address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_reserved
        or address.is_unspecified
    )
