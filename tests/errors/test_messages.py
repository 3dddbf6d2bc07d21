"""The message of every refusal on the security-critical paths, word for word.

A refusal's message is what a person acts on (which grant, which axis, which lease, what
to do next). They are pinned here so that changing one is a decision made on purpose,
and so that the mutation run (``scripts/mutation``) notices a message that lost its
subject or its advice. The chain verifier's reasons are pinned in
``tests/audit/test_chain_noticed.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import ValidationError

from charter.audit import parse_head
from charter.authority import (
    Clearance,
    Grant,
    PermissionMode,
    SealedGrant,
    check_custody,
    check_invariants,
    verify_grant_chain,
)
from charter.authority._axes import check_secret, check_tool
from charter.authority.errors import (
    AxisWidenedError,
    ClearanceRaisedError,
    CustodyKeyMismatchError,
    DepthNotDecreasingError,
    FanoutNotDecreasingError,
    ForeignRootError,
    GrantChainBrokenError,
    GrantExpiredError,
    GrantFormatError,
    GrantSignatureInvalidError,
    PermissionModeRaisedError,
)
from charter.budgets import BudgetLedgerOpened, LeaseBook
from charter.budgets.errors import (
    InsufficientBudgetError,
    LeaseEndedError,
    NoBudgetLedgerError,
    RenewalBeyondParentError,
)
from charter.core import AxisValueError, BadInputError, Budget, BudgetSyntaxError, StateError
from charter.core.destination import check_destination
from tests.authority._support import FAR_FUTURE_MS, root_grant, terms
from tests.authority.test_noticed import CHILD_KEY, ROOT, child_grant, child_terms

ROOT_PUBLIC = bytes(ROOT.verify_key)
LONG = "x" * 79 + "é" * 2 + "/"
T0 = 1_800_000_000_000
ALLOC = Budget(tokens=10, wall_ms=10, cpu_ms=10, mem_bytes=10, egress_bytes=10)
ONE = Budget(tokens=1, wall_ms=1, cpu_ms=1, mem_bytes=1, egress_bytes=1)


def _book() -> LeaseBook:
    book = LeaseBook()
    book.apply(BudgetLedgerOpened(lineage="agent:r", allocation=ALLOC), T0)
    for e in book.decide_leases("agent:r", [("agent:r/sa-1", ONE, T0 + 10, "0" * 64)], T0):
        book.apply(e, T0)
    for e in book.decide_leases("agent:r/sa-1", [("agent:r/sa-1/sa-1", ONE, T0 + 5, "0" * 64)], T0):
        book.apply(e, T0)
    return book


ROOT_GRANT = root_grant(ROOT)
GOOD_CHILD = child_grant(ROOT_GRANT, child_terms())
WIDE_ALL = child_terms(
    tools=frozenset({"Write"}),
    egress=frozenset({"evil.org"}),
    secrets=frozenset({"AWS_KEY"}),
    budget=Budget.parse("tokens=1000M,wall=0ms,cpu=0ms,mem=0B,egress=0B"),
    expires_at_ms=FAR_FUTURE_MS + 1,
)

CASES: list[tuple[str, Callable[[], object]]] = [
    ("parse_head", lambda: parse_head("12:abc")),
    ("tool name", lambda: check_tool(LONG)),
    ("secret name", lambda: check_secret(LONG)),
    ("destination", lambda: check_destination(LONG)),
    ("grant not json", lambda: Grant.from_body(b"{")),
    ("grant not canonical", lambda: Grant.from_body(ROOT_GRANT.body.replace(b'"v":1', b'"v": 1'))),
    ("record", lambda: SealedGrant.from_record({"body": "x"})),
    ("depth", lambda: check_invariants(terms(depth=2), child_terms(depth=2), remaining_fanout=99)),
    ("widened", lambda: check_invariants(terms(), WIDE_ALL, remaining_fanout=99)),
    (
        "clearance",
        lambda: check_invariants(
            terms(), child_terms(clearance=Clearance.SECRET), remaining_fanout=99
        ),
    ),
    (
        "mode",
        lambda: check_invariants(
            terms(), child_terms(mode=PermissionMode.BYPASS), remaining_fanout=99
        ),
    ),
    (
        "fanout",
        lambda: check_invariants(terms(), child_terms(fanout=4), remaining_fanout=9, width=2),
    ),
    ("custody", lambda: check_custody(bytes(32), ROOT_PUBLIC, who="agent:root")),
    (
        "root signature",
        lambda: verify_grant_chain(
            [SealedGrant(body=ROOT_GRANT.body, signature=bytes(64))], ROOT_PUBLIC
        ),
    ),
    (
        "child signature",
        lambda: verify_grant_chain(
            [ROOT_GRANT, child_grant(ROOT_GRANT, child_terms(), key=CHILD_KEY)], ROOT_PUBLIC
        ),
    ),
    ("empty chain", lambda: verify_grant_chain([], ROOT_PUBLIC)),
    ("foreign root", lambda: verify_grant_chain([ROOT_GRANT], bytes(32))),
    ("not a root", lambda: verify_grant_chain([GOOD_CHILD], ROOT_PUBLIC)),
    (
        "does not follow",
        lambda: verify_grant_chain([root_grant(ROOT, name="other"), GOOD_CHILD], ROOT_PUBLIC),
    ),
    (
        "different parent",
        lambda: verify_grant_chain([root_grant(ROOT, t=terms(depth=4)), GOOD_CHILD], ROOT_PUBLIC),
    ),
    (
        "expired",
        lambda: verify_grant_chain([ROOT_GRANT, GOOD_CHILD], ROOT_PUBLIC, now_ms=FAR_FUTURE_MS),
    ),
    ("no ledger", lambda: _book().get("agent:x")),
    (
        "insufficient",
        lambda: _book().decide_leases("agent:r", [("agent:r/sa-2", ALLOC, T0 + 1, "")], T0),
    ),
    (
        "outlive",
        lambda: _book().decide_leases(
            "agent:r/sa-1", [("agent:r/sa-1/sa-2", ONE, T0 + 11, "")], T0
        ),
    ),
    ("lease out ended", lambda: _book().decide_leases("agent:r/sa-1", [], T0 + 10)),
    ("usage ended", lambda: _book().decide_usage("agent:r/sa-1", ONE, T0 + 10)),
    ("release durable", lambda: _book().decide_release("agent:r", T0)),
    ("release ended", lambda: _book().decide_release("agent:r/sa-1", T0 + 10)),
    ("renew durable", lambda: _book().decide_renewal("agent:r", T0 + 1, T0)),
    ("renew ended", lambda: _book().decide_renewal("agent:r/sa-1", T0 + 20, T0 + 10)),
    ("renew not longer", lambda: _book().decide_renewal("agent:r/sa-1", T0 + 10, T0)),
    ("renew beyond parent", lambda: _book().decide_renewal("agent:r/sa-1/sa-1", T0 + 11, T0)),
    ("units tokens", lambda: Budget.parse("tokens=1x,wall=0ms,cpu=0ms,mem=0B,egress=0B")),
    ("units wall", lambda: Budget.parse("tokens=1,wall=1,cpu=0ms,mem=0B,egress=0B")),
    ("units mem", lambda: Budget.parse("tokens=1,wall=0ms,cpu=0ms,mem=1M,egress=0B")),
    ("not whole", lambda: Budget.parse("tokens=1,wall=0.5ms,cpu=0ms,mem=0B,egress=0B")),
    ("too large", lambda: Budget.parse(f"tokens={2**63},wall=0ms,cpu=0ms,mem=0B,egress=0B")),
    ("part", lambda: Budget.parse("tokens=1=2,wall=0ms,cpu=0ms,mem=0B,egress=0B")),
    ("unknown axis", lambda: Budget.parse("Tokens=1,wall=0ms,cpu=0ms,mem=0B,egress=0B")),
    ("twice", lambda: Budget.parse("tokens=1,tokens=1,wall=0ms,cpu=0ms,mem=0B,egress=0B")),
    ("missing", lambda: Budget.parse("tokens=1,mem=0B")),
    ("split", lambda: ALLOC.split(0)),
]


EXPECTED: dict[str, tuple[type[Exception], str]] = {
    "parse_head": (
        BadInputError,
        (
            "expected head '12:abc' is not POS:HASH (a position and 64 hex digits, "
            "as printed by `charter journal verify`)"
        ),
    ),
    "tool name": (
        AxisValueError,
        (
            "tool name "
            "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxé': "
            "start with a letter, then letters, digits, '_', '.', ':' or '-' (at "
            "most 128 characters)"
        ),
    ),
    "secret name": (
        AxisValueError,
        (
            "secret name "
            "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxé': "
            "start with a letter, then letters, digits, '_', '.' or '-' (at most 128 "
            "characters)"
        ),
    ),
    "destination": (
        AxisValueError,
        (
            "egress destination "
            "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxé': "
            "write an exact host (api.example.com) or a pattern for its subdomains "
            "(*.example.com), optionally with a port (api.example.com:8443): "
            "lower-case letters, digits and '-' in dot-separated labels; no scheme, "
            "path or bare '*'"
        ),
    ),
    "grant not json": (
        GrantFormatError,
        (
            "not a Charter grant: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)"
        ),
    ),
    "grant not canonical": (
        GrantFormatError,
        (
            "grant bytes are not in canonical form (sorted keys and sets, no "
            "spaces); a grant must be stored exactly as it was signed"
        ),
    ),
    "record": (
        GrantFormatError,
        ("not a sealed grant record: 'signature'"),
    ),
    "depth": (
        DepthNotDecreasingError,
        ("child depth 2 is not below its parent's 2; every spawn must use up a level"),
    ),
    "widened": (
        AxisWidenedError,
        (
            "child would hold more than its parent on tools, egress, secrets, "
            "budget, expiry; a child's authority must lie within its parent's on "
            "every axis"
        ),
    ),
    "clearance": (
        ClearanceRaisedError,
        (
            "child clearance 'secret' is above its parent's 'confidential'; "
            "clearance never rises down the tree"
        ),
    ),
    "mode": (
        PermissionModeRaisedError,
        ("child permission mode 'bypass' is more permissive than its parent's 'accept-edits'"),
    ),
    "fanout": (
        FanoutNotDecreasingError,
        (
            "2 child(ren) with a fan-out of 4 each need 10 of the parent's remaining "
            "9; a fan-out bounds its whole subtree"
        ),
    ),
    "custody": (
        CustodyKeyMismatchError,
        (
            "the custody key loaded for agent:root does not match its trust root; "
            "refusing to act with it (restore the right key file in the Charter home)"
        ),
    ),
    "root signature": (
        GrantSignatureInvalidError,
        (
            "grant for agent:root is not signed by the trust root of agent:root: it "
            "was forged or altered after sealing"
        ),
    ),
    "child signature": (
        GrantSignatureInvalidError,
        (
            "grant for agent:root/sa-1 is not signed by agent:root: it was forged or "
            "altered after sealing"
        ),
    ),
    "empty chain": (
        GrantChainBrokenError,
        ("an empty chain proves nothing; present the grants"),
    ),
    "foreign root": (
        ForeignRootError,
        (
            "the chain's root grant for agent:root is held by a different key than "
            "the root's trust root: it belongs to another root"
        ),
    ),
    "not a root": (
        GrantChainBrokenError,
        ("a chain must start at a root's ceiling grant, not at agent:root/sa-1"),
    ),
    "does not follow": (
        GrantChainBrokenError,
        ("grant for agent:root/sa-1 (issuer agent:root) does not follow the grant for agent:other"),
    ),
    "different parent": (
        GrantChainBrokenError,
        ("grant for agent:root/sa-1 names a different parent grant than the one presented"),
    ),
    "expired": (
        GrantExpiredError,
        ("grant for agent:root expired at 4000000000000 ms; ask its issuer for a new one"),
    ),
    "no ledger": (
        NoBudgetLedgerError,
        (
            "agent:x has no budget ledger, so it cannot spend or spawn; open one "
            "(charter init / agent add --budget) or spawn it with a lease"
        ),
    ),
    "insufficient": (
        InsufficientBudgetError,
        (
            "agent:r holds tokens=9,wall=9ms,cpu=9ms,mem=9B,egress=9B but 1 lease(s) "
            "need tokens=10,wall=10ms,cpu=10ms,mem=10B,egress=10B (short by "
            "tokens=1,wall=1ms,cpu=1ms,mem=1B,egress=1B); ask for less or wait for "
            "running leases to end"
        ),
    ),
    "outlive": (
        LeaseEndedError,
        (
            "a lease until 1800000000011 ms would outlive agent:r/sa-1's, which ends "
            "at 1800000000010 ms"
        ),
    ),
    "lease out ended": (
        LeaseEndedError,
        ("agent:r/sa-1's lease has ended; it cannot lease budget out"),
    ),
    "usage ended": (
        LeaseEndedError,
        ("agent:r/sa-1's lease has ended; record usage before releasing it"),
    ),
    "release durable": (
        StateError,
        ("agent:r is a durable agent's ledger, not a lease"),
    ),
    "release ended": (
        LeaseEndedError,
        ("agent:r/sa-1's lease has already ended"),
    ),
    "renew durable": (
        StateError,
        ("agent:r is a durable agent's ledger, not a lease"),
    ),
    "renew ended": (
        LeaseEndedError,
        ("agent:r/sa-1's lease has ended; it cannot be renewed"),
    ),
    "renew not longer": (
        BadInputError,
        (
            "renewal of agent:r/sa-1 to 1800000000010 ms does not extend it (it "
            "expires at 1800000000010 ms)"
        ),
    ),
    "renew beyond parent": (
        RenewalBeyondParentError,
        (
            "agent:r/sa-1/sa-1 cannot be renewed to 1800000000011 ms: its parent "
            "agent:r/sa-1 holds its budget only until 1800000000010 ms"
        ),
    ),
    "units tokens": (
        BudgetSyntaxError,
        (
            "budget axis 'tokens': cannot read '1x'; write a number with one of the "
            "units k, K, M (for example "
            "tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB)"
        ),
    ),
    "units wall": (
        BudgetSyntaxError,
        (
            "budget axis 'wall': cannot read '1'; write a number with one of the "
            "units ms, s, m, h (for example "
            "tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB)"
        ),
    ),
    "units mem": (
        BudgetSyntaxError,
        (
            "budget axis 'mem': cannot read '1M'; write a number with one of the "
            "units B, KiB, MiB, GiB, KB, MB, GB (for example "
            "tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB)"
        ),
    ),
    "not whole": (
        BudgetSyntaxError,
        ("budget axis 'wall': '0.5ms' is not a whole number"),
    ),
    "too large": (
        BudgetSyntaxError,
        (
            "budget axis 'tokens': '9223372036854775808' is more than the largest "
            "amount (9223372036854775807)"
        ),
    ),
    "part": (
        BudgetSyntaxError,
        (
            "budget axis 'tokens': cannot read '1=2'; write a number with one of the "
            "units k, K, M (for example "
            "tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB)"
        ),
    ),
    "unknown axis": (
        BudgetSyntaxError,
        (
            "budget part 'Tokens=1': expected NAME=QUANTITY with NAME one of tokens, "
            "wall, cpu, mem, egress"
        ),
    ),
    "twice": (
        BudgetSyntaxError,
        ("budget axis 'tokens' is given twice"),
    ),
    "missing": (
        BudgetSyntaxError,
        (
            "budget is missing wall, cpu, egress: give all five axes, for example "
            "tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB"
        ),
    ),
    "split": (
        BudgetSyntaxError,
        ("cannot split a budget into 0 parts"),
    ),
}


def test_every_case_has_its_message() -> None:
    assert [name for name, _ in CASES] == list(EXPECTED)


def test_a_bad_axis_value_in_a_model_carries_the_axis_message() -> None:
    """The validators hand the named error's message to pydantic unchanged."""
    for field, value, check in (
        ("egress", "A.com", check_destination),
        ("tools", "9tool", check_tool),
        ("secrets", "9secret", check_secret),
    ):
        with pytest.raises(AxisValueError) as direct:
            check(value)
        with pytest.raises(ValidationError) as caught:
            child_terms(**{field: frozenset({value})})
        assert caught.value.errors()[0]["msg"] == f"Value error, {direct.value}"


@pytest.mark.parametrize(("name", "call"), CASES, ids=[name for name, _ in CASES])
def test_the_refusal_says_what_happened_and_what_to_do(
    name: str, call: Callable[[], object]
) -> None:
    error, message = EXPECTED[name]
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error
    assert str(caught.value) == message
