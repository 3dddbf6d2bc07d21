"""Address entries in the egress vocabulary: IPv4 and bracketed IPv6 addresses and
ranges, with and without a port. What is well formed, how an entry splits, what it
admits by the literal asked for, what it grants after resolution, which addresses are
global, and what covers what when a grant is narrowed (docs/sandbox.md, "Brokers")."""

from __future__ import annotations

import ipaddress

import pytest

from charter.core import AxisValueError
from charter.core.destination import (
    admits,
    check_destination,
    covers,
    grants_address,
    is_global,
    split,
)


def _message(entry: str) -> str:
    return (
        f"egress destination {entry[:80]!r}: write an exact host (api.example.com), "
        "a pattern for its subdomains (*.example.com), an address or range (10.0.0.7, "
        "10.0.0.0/8, [::1], [fd00::/8]), optionally with a port (api.example.com:8443, "
        "[::1]:8443): lower-case letters, digits and '-' in dot-separated labels; no "
        "scheme, path or bare '*'"
    )


# -- well formed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        "10.0.0.7",
        "10.0.0.7:8443",
        "10.0.0.7:1",
        "10.0.0.7:65535",
        "10.0.0.0/8",
        "10.0.0.0/8:8443",
        "0.0.0.0/0",
        "192.168.1.0/24",
        "[::1]",
        "[::1]:8443",
        "[::1]:1",
        "[::1]:65535",
        "[fd00::/8]",
        "[fd00::/8]:443",
        "[2001:db8::7]",
        "[::ffff:10.0.0.1]",
        "[::/0]",
    ],
)
def test_address_entries_accepted_unchanged(entry: str) -> None:
    assert check_destination(entry) == entry


@pytest.mark.parametrize(
    "entry",
    [
        # IPv6 must be bracketed
        "::1",
        "fd00::/8",
        "2001:db8::7",
        "::1:8443",
        # brackets that do not close, or junk after them
        "[::1",
        "[::1]x",
        "[::1]8443",
        "[::1]]",
        "[]",
        "[]:443",
        # bad or missing ports after a bracket
        "[::1]:",
        "[::1]:0",
        "[::1]:08443",
        "[::1]:65536",
        "[::1]:99999",
        "[::1]:-1",
        "[::1]:http",
        "[::1]:443:443",
        # scoped IPv6 names no one host
        "[fe80::1%eth0]",
        "[fe80::1%eth0]:443",
        "[fe80::1%1]",
        # only IPv6 goes in brackets
        "[10.0.0.1]",
        "[10.0.0.0/8]",
        "[10.0.0.1]:443",
        "[api.example.com]",
        # host bits set in a range (strict)
        "[fd00::1/8]",
        "[fd00::1/8]:443",
        "10.0.0.1/8",
        "10.0.0.1/8:443",
        "192.168.1.1/24",
        # not a prefix length
        "10.0.0.0/33",
        "10.0.0.0/",
        "10.0.0.0/8/8",
        # bad ports after an IPv4 address or range
        "10.0.0.7:",
        "10.0.0.7:0",
        "10.0.0.7:65536",
        "10.0.0.7:08443",
        "10.0.0.0/8:0",
        "10.0.0.0/8:",
        "10.0.0.7:x",
    ],
)
def test_malformed_address_entries_refused(entry: str) -> None:
    with pytest.raises(AxisValueError) as caught:
        check_destination(entry)
    assert str(caught.value) == _message(entry)


def test_a_long_entry_is_quoted_to_80_characters() -> None:
    entry = "[" + "f" * 100 + "]"
    with pytest.raises(AxisValueError) as caught:
        check_destination(entry)
    assert str(caught.value) == _message(entry)
    assert repr(entry[:80]) in str(caught.value)
    assert repr(entry[:81]) not in str(caught.value)


def test_a_bad_range_is_refused_with_the_range_error_as_its_cause() -> None:
    with pytest.raises(AxisValueError) as caught:
        check_destination("10.0.0.1/8")
    assert isinstance(caught.value.__cause__, ValueError)
    assert "host bits" in str(caught.value.__cause__)


@pytest.mark.parametrize("entry", ["1.2.3", "1.2.3:8443", "127.1", "010.0.0.1", "*.0.1", "host.42"])
def test_digits_and_dots_that_are_no_address_are_refused_not_read_as_names(entry: str) -> None:
    # Resolvers read these as addresses (127.1 is 127.0.0.1; 010.0.0.1 is octal), and a
    # pattern over numeric labels would admit address literals: a name's last label is
    # never all digits.
    with pytest.raises(AxisValueError):
        check_destination(entry)


def test_a_name_with_digits_in_its_labels_is_still_a_name() -> None:
    # control: digits are fine inside labels and in any label but the last
    assert check_destination("1.2.example") == "1.2.example"
    assert check_destination("*.0.1.example:8443") == "*.0.1.example:8443"
    assert admits("*.0.1.example", "a.0.1.example", 443)
    assert not covers("1.2.0.0/16", "1.2.example")


# -- split ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("10.0.0.7", ("10.0.0.7", None)),
        ("10.0.0.7:8443", ("10.0.0.7", frozenset({8443}))),
        ("10.0.0.0/8", ("10.0.0.0/8", None)),
        ("10.0.0.0/8:443", ("10.0.0.0/8", frozenset({443}))),
        ("[::1]", ("[::1]", None)),
        ("[::1]:8443", ("[::1]", frozenset({8443}))),
        ("[::1]:1", ("[::1]", frozenset({1}))),
        ("[fd00::/8]", ("[fd00::/8]", None)),
        ("[fd00::/8]:443", ("[fd00::/8]", frozenset({443}))),
        ("[2001:db8::7]:65535", ("[2001:db8::7]", frozenset({65535}))),
        ("api.example.com", ("api.example.com", None)),
        ("*.example.com:8443", ("*.example.com", frozenset({8443}))),
    ],
)
def test_split(entry: str, expected: tuple[str, frozenset[int] | None]) -> None:
    assert split(entry) == expected


# -- admits (the literal asked for) ---------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "host", "port", "expected"),
    [
        # an IPv4 address, default and own ports
        ("10.0.0.7", "10.0.0.7", 443, True),
        ("10.0.0.7", "10.0.0.7", 80, True),
        ("10.0.0.7", "10.0.0.7", 8443, False),
        ("10.0.0.7", "10.0.0.8", 443, False),
        ("10.0.0.7:8443", "10.0.0.7", 8443, True),
        ("10.0.0.7:8443", "10.0.0.7", 443, False),
        # an IPv4 range: inside and outside
        ("10.0.0.0/8", "10.1.2.3", 443, True),
        ("10.0.0.0/8", "10.255.255.255", 80, True),
        ("10.0.0.0/8", "11.0.0.0", 443, False),
        ("10.0.0.0/8", "9.255.255.255", 443, False),
        ("10.0.0.0/8", "10.1.2.3", 8443, False),
        ("10.0.0.0/8:8443", "10.1.2.3", 8443, True),
        ("10.0.0.0/8:8443", "10.1.2.3", 443, False),
        # IPv6, asked for with or without brackets
        ("[::1]", "::1", 443, True),
        ("[::1]", "[::1]", 443, True),
        ("[::1]", "::2", 443, False),
        ("[::1]:8443", "::1", 8443, True),
        ("[::1]:8443", "[::1]", 8443, True),
        ("[::1]:8443", "::1", 443, False),
        ("[fd00::/8]", "fd00::1", 443, True),
        ("[fd00::/8]", "[fd12:3456::1]", 80, True),
        ("[fd00::/8]", "fe80::1", 443, False),
        ("[fd00::/8]", "[fe80::1]", 443, False),
        ("[fd00::/8]", "fd00::1", 8443, False),
        # IPv4 and IPv6 never admit each other
        ("[::/0]", "10.0.0.1", 443, False),
        ("0.0.0.0/0", "::1", 443, False),
        ("0.0.0.0/0", "[::1]", 443, False),
        ("10.0.0.0/8", "::ffff:10.0.0.1", 443, False),
        # names and addresses never admit each other
        ("10.0.0.0/8", "api.example.com", 443, False),
        ("0.0.0.0/0", "localhost", 443, False),
        ("[::/0]", "localhost", 443, False),
        ("[::/0]", "[localhost]", 443, False),
        ("api.example.com", "10.0.0.1", 443, False),
        ("*.example.com", "::1", 443, False),
    ],
)
def test_what_an_address_entry_admits(entry: str, host: str, port: int, expected: bool) -> None:
    assert admits(entry, host, port) is expected


# -- grants_address (the address a name resolved to) ----------------------------------

V4 = ipaddress.IPv4Address
V6 = ipaddress.IPv6Address


@pytest.mark.parametrize(
    ("entry", "address", "port", "expected"),
    [
        ("10.0.0.0/8", V4("10.1.2.3"), 443, True),
        ("10.0.0.0/8", V4("10.1.2.3"), 80, True),
        ("10.0.0.0/8", V4("10.1.2.3"), 8443, False),
        ("10.0.0.0/8", V4("11.0.0.1"), 443, False),
        ("10.0.0.0/8:8443", V4("10.1.2.3"), 8443, True),
        ("10.0.0.0/8:8443", V4("10.1.2.3"), 443, False),
        ("127.0.0.1", V4("127.0.0.1"), 443, True),
        # an IPv4-mapped IPv6 address is the IPv4 address it carries
        ("127.0.0.1", V6("::ffff:127.0.0.1"), 443, True),
        ("10.0.0.0/8", V6("::ffff:10.1.2.3"), 443, True),
        ("10.0.0.0/8", V6("::ffff:11.0.0.1"), 443, False),
        ("[fd00::/8]", V6("fd00::1"), 443, True),
        ("[fd00::/8]:8443", V6("fd00::1"), 8443, True),
        ("[fd00::/8]", V6("fe80::1"), 443, False),
        ("[fd00::/8]", V4("10.0.0.1"), 443, False),
        ("0.0.0.0/0", V6("::1"), 443, False),
        # a name entry grants no address, whatever it is
        ("api.example.com", V4("10.0.0.1"), 443, False),
        ("*.example.com", V6("::1"), 443, False),
        ("*.0.1", V4("10.0.0.1"), 443, False),
    ],
)
def test_what_an_entry_grants(
    entry: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, expected: bool
) -> None:
    assert grants_address(entry, address, port) is expected


# -- is_global ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("8.8.8.8", True),
        ("1.1.1.1", True),
        ("2001:4860:4860::8888", True),
        ("127.0.0.1", False),  # loopback
        ("::1", False),
        ("169.254.169.254", False),  # link-local: cloud metadata
        ("fe80::1", False),
        ("10.0.0.1", False),  # private
        ("192.168.1.1", False),
        ("fc00::1", False),
        ("100.64.0.1", False),  # shared
        ("0.0.0.0", False),  # unspecified
        ("::", False),
        ("224.0.0.1", False),  # multicast, which Python counts as global
        ("ff0e::1", False),
        ("240.0.0.1", False),  # reserved
        ("4000::1", False),  # reserved IPv6, which Python counts as global
        ("e000::1", False),
        ("192.0.2.1", False),  # documentation
        ("2001:db8::1", False),
        # IPv4 mapped into IPv6, or behind NAT64, is judged as the IPv4 it carries
        ("::ffff:127.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("::ffff:8.8.8.8", True),
        ("64:ff9b::7f00:1", False),
        ("64:ff9b::a9fe:a9fe", False),
        ("64:ff9b::808:808", True),
        ("64:ff9b::101:101", True),
    ],
)
def test_is_global(address: str, expected: bool) -> None:
    assert is_global(ipaddress.ip_address(address)) is expected


# -- covers (a grant narrowed) --------------------------------------------------------


@pytest.mark.parametrize(
    ("wider", "narrower", "expected"),
    [
        # IPv4 ranges and addresses
        ("10.0.0.0/8", "10.0.0.0/8", True),
        ("10.0.0.0/8", "10.1.0.0/16", True),
        ("10.0.0.0/8", "10.1.2.3", True),
        ("10.1.0.0/16", "10.0.0.0/8", False),
        ("10.0.0.0/8", "11.0.0.0/8", False),
        ("10.0.0.0/8", "11.0.0.1", False),
        ("10.0.0.7", "10.0.0.7", True),
        ("10.0.0.7", "10.0.0.8", False),
        # ports, as for names
        ("10.0.0.0/8", "10.1.2.3:443", True),
        ("10.0.0.0/8", "10.1.2.3:8443", False),
        ("10.0.0.0/8:8443", "10.1.2.3", False),
        ("10.0.0.0/8:8443", "10.1.2.3:8443", True),
        ("10.0.0.0/8:443", "10.1.2.3", False),
        # IPv6
        ("[fd00::/8]", "[fd00::/8]", True),
        ("[fd00::/8]", "[fd00::/16]", True),
        ("[fd00::/8]", "[fd00::1]", True),
        ("[fd00::/16]", "[fd00::/8]", False),
        ("[fd00::/8]", "[fe80::1]", False),
        ("[fd00::/8]:8443", "[fd00::1]:8443", True),
        ("[fd00::/8]", "[fd00::1]:8443", False),
        ("[fd00::/8]:8443", "[fd00::1]", False),
        ("[::1]", "[::1]", True),
        # versions differ: never covered (and no error)
        ("[::/0]", "10.0.0.1", False),
        ("[::/0]", "0.0.0.0/0", False),
        ("0.0.0.0/0", "[::1]", False),
        ("0.0.0.0/0", "[::/0]", False),
        ("[::ffff:0:0/96]", "10.0.0.1", False),
        # names and addresses never cover each other
        ("0.0.0.0/0", "api.example.com", False),
        ("[::/0]", "api.example.com", False),
        ("api.example.com", "10.0.0.1", False),
        ("*.example.com", "[::1]", False),
        ("*.0.1", "10.0.0.1", False),  # a name pattern whose labels look numeric
        ("*.0.1", "10.0.0.0/31", False),
    ],
)
def test_what_covers_what_for_addresses(wider: str, narrower: str, expected: bool) -> None:
    assert covers(wider, narrower) is expected
