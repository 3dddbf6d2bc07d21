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
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator

from charter.core.errors import AxisValueError

__all__ = [
    "DEFAULT_PORTS",
    "Destination",
    "IPAddress",
    "admits",
    "axis_validator",
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


def axis_validator(check: Callable[[str], str]) -> AfterValidator:
    """A grant axis's check as a pydantic validator: its AxisValueError becomes the
    ValueError pydantic reports (one adapter for every axis of names)."""

    def run(value: str) -> str:
        try:
            return check(value)
        except AxisValueError as e:
            raise ValueError(str(e)) from e

    return AfterValidator(run)


Destination = Annotated[str, axis_validator(check_destination)]


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


# The IANA special-purpose address registries (iana-ipv4-special-registry,
# iana-ipv6-special-registry), every entry whose "Globally Reachable" is False or N/A,
# plus what the address-space registries keep off the public internet (multicast, the
# deprecated site-local fec0::/10). Python's ``ipaddress.is_global`` misses some of these
# (6to4 2002::/16 and site-local fec0::/10 are "global" to it, and its lists change
# between versions), so this table is the filter and ``is_global`` only narrows it.
_NOT_GLOBAL_V4 = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # shared address space (carrier-grade NAT)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link local (cloud metadata)
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments (192.0.0.9, .10 are refused too)
        "192.0.2.0/24",  # documentation (TEST-NET-1)
        "192.88.99.0/24",  # deprecated 6to4 relay anycast
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation (TEST-NET-2)
        "203.0.113.0/24",  # documentation (TEST-NET-3)
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the limited broadcast 255.255.255.255
    )
)
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
"""IANA's IPv6 address space: only 2000::/3 is allocated global unicast; everything
outside it (::/128, ::1, IPv4-compatible ::/96, 100::/64 discard, 64:ff9b:1::/48
local-use translation, 5f00::/16 SRv6, fc00::/7, fe80::/10, fec0::/10, ff00::/8) is
not the public internet. 64:ff9b::/96 (NAT64) is judged as the IPv4 address it carries
before this check."""
_NOT_GLOBAL_V6 = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "2001::/23",  # IETF protocol assignments: Teredo (2001::/32), benchmarking, ORCHID…
        "2001:db8::/32",  # documentation
        "2002::/16",  # 6to4: carries an IPv4 address (any, private included) to a relay
        "3fff::/20",  # documentation (RFC 9637)
    )
)


def is_global(address: IPAddress) -> bool:
    """True for an address on the public internet. Refused: every range the IANA
    special-purpose registries do not mark globally reachable (loopback, link-local with
    cloud metadata at 169.254.169.254 and fe80::/10, private RFC 1918 and fc00::/7, shared
    100.64/10, unspecified, benchmarking, documentation, reserved, protocol assignments,
    Teredo 2001::/32, 6to4 2002::/16), multicast, site-local fec0::/10, and every IPv6
    address outside global unicast 2000::/3. The registry's few globally reachable
    exceptions inside those blocks (anycast services such as 192.0.0.9 or 2001:1::1) are
    refused as well: the filter errs closed. IPv4 mapped into IPv6 or behind NAT64
    (64:ff9b::/96) is judged as the IPv4 address it carries; Python's own
    ``is_global`` must agree too."""
    address = _unmapped(address)
    if isinstance(address, ipaddress.IPv6Address) and address in _NAT64:
        address = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if isinstance(address, ipaddress.IPv4Address):
        if any(address in net for net in _NOT_GLOBAL_V4):
            return False
    elif (
        address not in _GLOBAL_UNICAST_V6
        or address.scope_id is not None
        or any(address in net for net in _NOT_GLOBAL_V6)
    ):
        return False
    return address.is_global and not (
        address.is_multicast
        or address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_reserved
        or address.is_unspecified
    )
