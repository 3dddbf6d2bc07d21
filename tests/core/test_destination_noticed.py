"""The egress vocabulary at its boundaries: what an entry admits (the broker's check),
what covers what (the grant's narrowing), and which entries are well formed."""

from __future__ import annotations

import pytest

from charter.core import AxisValueError
from charter.core.destination import DEFAULT_PORTS, admits, check_destination, covers, split


@pytest.mark.parametrize(
    ("entry", "host", "port", "expected"),
    [
        ("api.example.com", "api.example.com", 443, True),
        ("api.example.com", "api.example.com", 80, True),
        ("api.example.com", "api.example.com", 8443, False),  # not a default port
        ("api.example.com", "API.Example.COM.", 443, True),  # normalised first
        ("api.example.com", "api.example.com..", 443, True),
        ("api.example.com", "x.api.example.com", 443, False),
        ("api.example.com", "example.com", 443, False),
        ("api.example.com:8443", "api.example.com", 8443, True),
        ("api.example.com:8443", "api.example.com", 443, False),  # only its port
        ("*.example.com", "a.example.com", 443, True),
        ("*.example.com", "a.b.example.com", 80, True),
        ("*.example.com", "example.com", 443, False),  # strictly below
        ("*.example.com", ".example.com", 443, False),  # an empty label is not a host
        ("*.example.com", "badexample.com", 443, False),  # a suffix, not a subdomain
        ("*.example.com", "A.EXAMPLE.COM", 443, True),
        ("*.example.com:8443", "a.example.com", 8443, True),
        ("*.example.com:8443", "a.example.com", 443, False),
    ],
)
def test_what_an_entry_admits(entry: str, host: str, port: int, expected: bool) -> None:
    assert admits(entry, host, port) is expected


@pytest.mark.parametrize(
    ("wider", "narrower", "expected"),
    [
        ("api.example.com", "api.example.com", True),
        ("api.example.com:443", "api.example.com", False),  # 80 would widen
        ("api.example.com", "api.example.com:443", True),
        ("api.example.com", "api.example.com:8443", False),
        ("api.example.com:8443", "api.example.com:8443", True),
        ("*.example.com", "*.example.com", True),
        ("*.example.com", "*.a.example.com", True),
        ("*.example.com", "a.example.com", True),
        ("*.example.com", "example.com", False),
        ("*.example.com", "*.badexample.com", False),
        ("*.a.example.com", "*.example.com", False),
        ("a.example.com", "*.example.com", False),
        ("*.example.com:8443", "a.example.com", False),
        ("*.example.com", "a.example.com:80", True),
    ],
)
def test_what_covers_what(wider: str, narrower: str, expected: bool) -> None:
    assert covers(wider, narrower) is expected


def test_split_reads_the_port() -> None:
    assert split("a.b") == ("a.b", None)
    assert split("a.b:8443") == ("a.b", frozenset({8443}))
    assert split("*.a.b:1") == ("*.a.b", frozenset({1}))
    assert frozenset({80, 443}) == DEFAULT_PORTS


LABEL63 = "a" * 63
HOST253 = ".".join([LABEL63] * 3 + ["b" * 61])


@pytest.mark.parametrize(
    "good",
    [
        "a",
        "a-b.c",
        "0.a",
        LABEL63 + ".com",
        HOST253,
        "*." + HOST253,
        "a.com:1",
        "a.com:65535",
        "*.a.com:8443",
    ],
)
def test_well_formed_entries(good: str) -> None:
    assert len(HOST253) == 253
    assert check_destination(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "*",
        "*.",
        "a" * 64 + ".com",  # a label longer than 63
        HOST253 + "b",  # a host longer than 253
        "-a.com",
        "a-.com",
        "A.com",
        "a..com",
        "a.com.",
        "a.*.com",
        "**.a.com",
        "a.com:0",
        "a.com:65536",
        "a.com:08443",
        "a.com:",
        "a.com:http",
        "https://a.com",
        "a.com/path",
        "a_b.com",
    ],
)
def test_malformed_entries_are_refused(bad: str) -> None:
    with pytest.raises(AxisValueError, match="egress destination"):
        check_destination(bad)
