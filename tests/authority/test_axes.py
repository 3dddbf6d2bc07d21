"""Each axis: what "narrower" means and how two values meet."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from charter.authority import (
    Clearance,
    PermissionMode,
    check_secret,
    check_tool,
    covers,
    egress_meet,
    egress_within,
)
from charter.core import AxisValueError
from charter.core.destination import check_destination
from tests.authority._support import DESTINATIONS, egress_sets


def admits(rules: frozenset[str], host: str) -> bool:
    return any(covers(rule, host) for rule in rules)


HOSTS = [
    "example.com",
    "api.example.com",
    "x.api.example.com",
    "deep.x.api.example.com",
    "pypi.org",
    "files.pypi.org",
    "other.org",
    "evil-example.com",
    "example.com.evil.net",
]


@pytest.mark.parametrize(
    ("rule", "host", "expected"),
    [
        ("*.example.com", "api.example.com", True),
        ("*.example.com", "x.api.example.com", True),
        ("*.example.com", "example.com", False),  # the pattern is for subdomains only
        ("*.example.com", "evil-example.com", False),
        ("*.example.com", "example.com.evil.net", False),
        ("api.example.com", "api.example.com", True),
        ("api.example.com", "x.api.example.com", False),
        ("*.example.com", "*.api.example.com", True),
        ("*.api.example.com", "*.example.com", False),
        ("api.example.com", "*.api.example.com", False),
    ],
)
def test_covers(rule: str, host: str, expected: bool) -> None:
    assert covers(rule, host) is expected


def test_egress_meet_examples() -> None:
    assert egress_meet(frozenset({"api.example.com"}), frozenset({"*.example.com"})) == {
        "api.example.com"
    }
    assert egress_meet(frozenset({"*.example.com"}), frozenset({"*.api.example.com"})) == {
        "*.api.example.com"
    }
    assert egress_meet(frozenset({"*.example.com"}), frozenset({"pypi.org"})) == frozenset()
    # A wide request against a narrow parent yields the parent's entries, no more.
    assert egress_meet(frozenset({"*.org"}), frozenset({"pypi.org", "*.pypi.org"})) == {
        "pypi.org",
        "*.pypi.org",
    }


def test_two_spellings_of_one_network_keep_one_of_them() -> None:
    """``10.0.0.7`` and ``10.0.0.7/32`` cover each other: minimal form keeps the first by
    code point (it once dropped both, and a child granted the host lost it)."""
    both = frozenset({"10.0.0.7", "10.0.0.7/32"})
    assert egress_meet(both, frozenset({"10.0.0.0/8"})) == {"10.0.0.7"}
    assert egress_meet(frozenset({"10.0.0.0/8"}), both) == {"10.0.0.7"}
    # Control: a strictly wider entry still drops the narrower one.
    assert egress_meet(frozenset({"10.0.0.0/8", "10.0.0.7"}), frozenset({"10.0.0.0/8"})) == {
        "10.0.0.0/8"
    }


@settings(max_examples=2000, deadline=None)
@given(egress_sets, egress_sets)
def test_egress_meet_is_within_both_and_admits_exactly_the_common_hosts(
    a: frozenset[str], b: frozenset[str]
) -> None:
    m = egress_meet(a, b)
    assert egress_within(m, a)
    assert egress_within(m, b)
    for host in HOSTS:
        assert admits(m, host) == (admits(a, host) and admits(b, host))
    assert egress_meet(a, b) == egress_meet(b, a)


@settings(max_examples=2000, deadline=None)
@given(egress_sets, egress_sets)
def test_egress_within_agrees_with_the_hosts_admitted(a: frozenset[str], b: frozenset[str]) -> None:
    if egress_within(a, b):
        assert all(admits(b, h) for h in HOSTS if admits(a, h))


def test_ordered_levels() -> None:
    assert [c.value for c in Clearance] == ["public", "internal", "confidential", "secret"]
    assert Clearance.INTERNAL.within(Clearance.SECRET)
    assert not Clearance.SECRET.within(Clearance.INTERNAL)
    assert Clearance.SECRET.meet(Clearance.PUBLIC) is Clearance.PUBLIC
    modes = [m.value for m in PermissionMode]
    assert modes == ["plan", "default", "accept-edits", "bypass"]
    assert PermissionMode.BYPASS.meet(PermissionMode.PLAN) is PermissionMode.PLAN
    assert not PermissionMode.BYPASS.within(PermissionMode.ACCEPT_EDITS)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(list(Clearance)), st.sampled_from(list(Clearance)))
def test_clearance_meet_is_the_lower(a: Clearance, b: Clearance) -> None:
    m = a.meet(b)
    assert m.within(a)
    assert m.within(b)
    assert m in (a, b)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "*",
        "*.",
        "http://x.com",
        "x.com:",
        "x.com:0",
        "x.com:08",
        "x.com:65536",
        "x.com:443:1",
        "x.com/path",
        "X.com",
        "a..b",
        "-a.com",
        "a-.com",
        "*.*.com",
        "a.*.com",
        "x" * 64 + ".com",
        "é.com",
        " x.com",
    ],
)
def test_bad_destinations_are_refused(bad: str) -> None:
    with pytest.raises(AxisValueError, match="egress destination"):
        check_destination(bad)


@pytest.mark.parametrize("good", DESTINATIONS)
def test_good_destinations(good: str) -> None:
    assert check_destination(good) == good


def test_tool_and_secret_names() -> None:
    assert check_tool("mcp:github.create_issue") == "mcp:github.create_issue"
    assert check_secret("GITHUB_TOKEN") == "GITHUB_TOKEN"
    for bad in ["", "1tool", "to ol", "tool;rm", "a" * 129]:
        with pytest.raises(AxisValueError, match="tool name"):
            check_tool(bad)
    for bad in ["", "A:B", "x y"]:
        with pytest.raises(AxisValueError, match="secret name"):
            check_secret(bad)
