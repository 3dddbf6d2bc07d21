"""The egress address filter refuses every range the IANA special-purpose registries
(IPv4 and IPv6) do not mark globally reachable, including the ones Python's
``ipaddress.is_global`` calls global (6to4 2002::/16, site-local fec0::/10); ordinary
public addresses, and public IPv4 reached through mapping or NAT64, stay admitted."""

from __future__ import annotations

import ipaddress

import pytest

from charter.core.destination import is_global

# Each non-global block as (first, last) address: both ends are refused.
NOT_GLOBAL = [
    # IPv4 special-purpose registry (Globally Reachable False or N/A), multicast, reserved
    ("0.0.0.0", "0.255.255.255"),
    ("10.0.0.0", "10.255.255.255"),
    ("100.64.0.0", "100.127.255.255"),
    ("127.0.0.0", "127.255.255.255"),
    ("169.254.0.0", "169.254.255.255"),
    ("172.16.0.0", "172.31.255.255"),
    ("192.0.0.0", "192.0.0.255"),
    ("192.0.2.0", "192.0.2.255"),
    ("192.88.99.0", "192.88.99.255"),
    ("192.168.0.0", "192.168.255.255"),
    ("198.18.0.0", "198.19.255.255"),
    ("198.51.100.0", "198.51.100.255"),
    ("203.0.113.0", "203.0.113.255"),
    ("224.0.0.0", "239.255.255.255"),
    ("240.0.0.0", "255.255.255.255"),
    # IPv6 special-purpose registry (Globally Reachable False or N/A)
    ("::", "::"),
    ("::1", "::1"),
    ("::ffff:0.0.0.0", "::ffff:0.255.255.255"),  # mapped: judged as IPv4
    ("::ffff:10.0.0.0", "::ffff:10.255.255.255"),
    ("64:ff9b::a00:0", "64:ff9b::aff:ffff"),  # NAT64 of 10/8
    ("64:ff9b::a9fe:a9fe", "64:ff9b::a9fe:a9fe"),  # NAT64 of cloud metadata
    ("64:ff9b:1::", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff"),
    ("100::", "100::ffff:ffff:ffff:ffff"),
    ("2001::", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff"),  # Teredo, IETF assignments
    ("2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"),
    ("2002::", "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),  # 6to4
    ("2002:a9fe:a9fe::", "2002:a9fe:a9fe::1"),  # 6to4 of cloud metadata
    ("3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff"),
    ("5f00::", "5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
    ("fc00::", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
    ("fe80::", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
    ("fec0::", "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),  # site-local
    ("ff00::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
    # outside global unicast 2000::/3
    ("::a00:1", "::a00:1"),  # IPv4-compatible (deprecated)
    ("4000::", "4000::1"),
    ("e000::", "e000::1"),
]


@pytest.mark.parametrize(("first", "last"), NOT_GLOBAL)
def test_every_special_purpose_block_is_refused(first: str, last: str) -> None:
    assert not is_global(ipaddress.ip_address(first))
    assert not is_global(ipaddress.ip_address(last))


@pytest.mark.parametrize("address", ["2002::1", "2002:808:808::1", "fec0::1", "fed0::1"])
def test_the_gaps_of_pythons_is_global_are_closed(address: str) -> None:
    # The attack: Python calls these global; a grant of a name resolving to one of
    # them would reach a relay or a site-local network.
    assert not is_global(ipaddress.ip_address(address))


def test_a_scoped_ipv6_address_is_refused() -> None:
    assert not is_global(ipaddress.ip_address("2001:4860:4860::8888%eth0"))


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "9.255.255.255",  # just below 10/8
        "11.0.0.0",  # just above it
        "100.63.255.255",
        "100.128.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.0.1.1",
        "192.169.0.0",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.254",
        "2001:4860:4860::8888",
        "2606:4700:4700::1111",
        "2003::1",  # just past 6to4
        "2001:200::1",  # just past 2001::/23
        "3ffe:ffff::1",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",  # NAT64 of a public address
    ],
)
def test_public_addresses_stay_global(address: str) -> None:
    assert is_global(ipaddress.ip_address(address))
