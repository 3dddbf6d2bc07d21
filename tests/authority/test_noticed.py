"""Authority properties that no other test pinned (issue 14), each shown by an attack that
fails beside a positive control that passes.

Every test here was checked against the code with its property removed (the root
signature check, the attenuation re-check in chain verification, the parent-link
validator, the fan-out bound) and fails then.
"""

from __future__ import annotations

from typing import Any

import pytest
from nacl.signing import SigningKey
from pydantic import ValidationError

from charter.authority import (
    Clearance,
    Grant,
    GrantTerms,
    PermissionMode,
    RequestedGrant,
    SealedGrant,
    SpawnIntent,
    attenuate,
    check_invariants,
    derive_child_seed,
    errors,
    seal,
    verify_grant_chain,
)
from charter.core import Budget, Lineage
from tests.authority._support import BIG, FAR_FUTURE_MS, NOW_MS, root_grant, terms

ROOT = SigningKey(b"\x05" * 32)
ROOT_PUBLIC = bytes(ROOT.verify_key)
CHILD_LINEAGE = Lineage("agent:root/sa-1")
CHILD_KEY = SigningKey(derive_child_seed(bytes(ROOT), CHILD_LINEAGE))
HALF = BIG.split(2)
MORE_CPU = BIG.model_copy(update={"cpu_ms": BIG.cpu_ms + 1})


def child_terms(**over: Any) -> GrantTerms:
    """Terms strictly within ``terms()`` on every axis (the root's defaults)."""
    base: dict[str, Any] = {
        "tools": frozenset({"Read"}),
        "egress": frozenset({"api.example.com"}),
        "secrets": frozenset(),
        "clearance": Clearance.INTERNAL,
        "mode": PermissionMode.DEFAULT,
        "depth": 2,
        "fanout": 10,
        "budget": HALF,
        "expires_at_ms": FAR_FUTURE_MS - 1,
    }
    base.update(over)
    return GrantTerms(**base)


def child_grant(parent: SealedGrant, t: GrantTerms, key: SigningKey = ROOT) -> SealedGrant:
    """A child grant, correctly linked to ``parent`` and signed by ``key``."""
    grant = Grant(
        lineage=CHILD_LINEAGE,
        issuer=CHILD_LINEAGE.parent,
        subject_key=bytes(CHILD_KEY.verify_key).hex(),
        parent_digest=parent.digest.hex(),
        issued_at_ms=NOW_MS,
        terms=t,
    )
    return seal(grant, key)


# -- 1. the root's own signature -------------------------------------------------------


def test_a_root_grant_with_a_forged_signature_is_refused() -> None:
    genuine = root_grant(ROOT)
    assert verify_grant_chain([genuine], ROOT_PUBLIC).lineage == Lineage.root("root")
    for signature in (bytes(64), b"\xff" * 64, SigningKey(b"\x06" * 32).sign(genuine.body)[:64]):
        forged = SealedGrant(body=genuine.body, signature=signature)
        with pytest.raises(errors.GrantSignatureInvalidError) as caught:
            verify_grant_chain([forged], ROOT_PUBLIC)
        assert caught.value.reason == "grant-signature-invalid"
    # Signed by the right key but over the bare body (no domain tag): still refused.
    untagged = SealedGrant(body=genuine.body, signature=ROOT.sign(genuine.body).signature)
    with pytest.raises(errors.GrantSignatureInvalidError):
        verify_grant_chain([untagged], ROOT_PUBLIC)


def test_a_forged_root_signature_is_refused_under_a_genuine_child() -> None:
    genuine = root_grant(ROOT)
    child = child_grant(genuine, child_terms())
    assert verify_grant_chain([genuine, child], ROOT_PUBLIC).lineage == CHILD_LINEAGE
    forged = SealedGrant(body=genuine.body, signature=bytes(64))
    with pytest.raises(errors.GrantSignatureInvalidError):
        verify_grant_chain([forged, child], ROOT_PUBLIC)


# -- 2. a correctly signed child that widens its parent ----------------------------------

WIDENINGS: list[tuple[str, dict[str, Any], type[errors.InvariantViolationError]]] = [
    ("tools", {"tools": frozenset({"Read", "Write"})}, errors.AxisWidenedError),
    ("egress", {"egress": frozenset({"evil.org"})}, errors.AxisWidenedError),
    ("egress pattern", {"egress": frozenset({"*.com"})}, errors.AxisWidenedError),
    ("secrets", {"secrets": frozenset({"AWS_KEY"})}, errors.AxisWidenedError),
    ("budget", {"budget": MORE_CPU}, errors.AxisWidenedError),
    ("expiry", {"expires_at_ms": FAR_FUTURE_MS + 1}, errors.AxisWidenedError),
    ("clearance", {"clearance": Clearance.SECRET}, errors.ClearanceRaisedError),
    ("mode", {"mode": PermissionMode.BYPASS}, errors.PermissionModeRaisedError),
    ("depth", {"depth": 3}, errors.DepthNotDecreasingError),
    ("fanout", {"fanout": 2000}, errors.FanoutNotDecreasingError),
]


@pytest.mark.parametrize(
    ("over", "error"), [w[1:] for w in WIDENINGS], ids=[w[0] for w in WIDENINGS]
)
def test_a_correctly_signed_child_that_widens_its_parent_is_refused(
    over: dict[str, Any], error: type[errors.InvariantViolationError]
) -> None:
    root = root_grant(ROOT)
    # Positive control: the same child, within its parent, verifies.
    assert verify_grant_chain([root, child_grant(root, child_terms())], ROOT_PUBLIC)
    wide = child_grant(root, child_terms(**over))
    # The signature is genuine (the parent's key signed it): only attenuation is wrong.
    ROOT.verify_key.verify(b"charter/grant/v1\x00" + wide.body, wide.signature)
    with pytest.raises(error) as caught:
        verify_grant_chain([root, wide], ROOT_PUBLIC)
    assert caught.value.reason.startswith("invariant-")


def test_the_last_fanout_unit_of_a_chain_is_the_boundary() -> None:
    """A child holding its parent's whole fan-out less itself verifies; one more does not."""
    root = root_grant(ROOT, t=terms(fanout=5))
    assert verify_grant_chain([root, child_grant(root, child_terms(fanout=4))], ROOT_PUBLIC)
    with pytest.raises(errors.FanoutNotDecreasingError):
        verify_grant_chain([root, child_grant(root, child_terms(fanout=5))], ROOT_PUBLIC)


def test_a_child_signed_by_its_own_key_instead_of_its_parents_is_refused() -> None:
    root = root_grant(ROOT)
    self_signed = child_grant(root, child_terms(), key=CHILD_KEY)
    with pytest.raises(errors.GrantSignatureInvalidError):
        verify_grant_chain([root, self_signed], ROOT_PUBLIC)


def test_a_child_issued_by_another_lineage_is_refused() -> None:
    """Issuer and parent link agree (the validator), but the chain names another parent."""
    root = root_grant(ROOT)
    other_root = root_grant(ROOT, name="other")
    stray = child_grant(other_root, child_terms())  # agent:root/sa-1 under agent:other
    with pytest.raises(errors.GrantChainBrokenError, match="does not follow"):
        verify_grant_chain([other_root, stray], bytes(ROOT.verify_key))
    assert verify_grant_chain([root, child_grant(root, child_terms())], ROOT_PUBLIC)


# -- 6. the grant's parent-link validator ----------------------------------------------


def _grant(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "lineage": CHILD_LINEAGE,
        "issuer": CHILD_LINEAGE.parent,
        "subject_key": "ab" * 32,
        "parent_digest": "cd" * 32,
        "issued_at_ms": NOW_MS,
        "terms": child_terms(),
    }
    base.update(over)
    return base


BAD_LINKS = {
    "root issued by another": {
        "lineage": Lineage.root("root"),
        "issuer": Lineage.root("other"),
        "parent_digest": None,
    },
    "root naming a parent": {"lineage": Lineage.root("root"), "issuer": Lineage.root("root")},
    "child issued by itself": {"issuer": CHILD_LINEAGE},
    "child issued by its grandparent": {
        "lineage": Lineage("agent:root/sa-1/sa-2"),
        "issuer": Lineage.root("root"),
    },
    "child issued by a sibling": {"issuer": Lineage("agent:root/sa-2")},
    "child without a parent digest": {"parent_digest": None},
    "expires before issued": {"issued_at_ms": FAR_FUTURE_MS},
    "deeper than any lineage": {"terms": child_terms(depth=32)},
}


@pytest.mark.parametrize("over", BAD_LINKS.values(), ids=BAD_LINKS.keys())
def test_the_parent_link_validator_refuses_a_grant_that_does_not_link(
    over: dict[str, Any],
) -> None:
    assert Grant(**_grant()).issuer == CHILD_LINEAGE.parent  # positive control
    assert Grant(
        **_grant(lineage=Lineage.root("root"), issuer=Lineage.root("root"), parent_digest=None)
    ).lineage.is_root
    with pytest.raises(ValidationError):
        Grant(**_grant(**over))
    # The same grant as stored bytes (what a verifier reads) is not a grant either.
    good = Grant(**_grant())
    body = good.canonical_body()
    bad = body
    for name, value in over.items():
        if name == "terms":
            bad = bad.replace(good.terms.canonical_bytes, value.canonical_bytes)
        elif name == "parent_digest":
            bad = bad.replace(b'"' + b"cd" * 32 + b'"', b"null")
        else:
            key, old, new = name.encode(), str(getattr(good, name)), str(value)
            for quote in (b'"', b""):
                was = b'"%s":%s%s%s' % (key, quote, old.encode(), quote)
                bad = bad.replace(was, b'"%s":%s%s%s' % (key, quote, new.encode(), quote))
    assert bad != body
    with pytest.raises(errors.GrantFormatError):
        Grant.from_body(bad)
    assert Grant.from_body(body) == good


def test_the_deepest_allowed_grant_is_accepted() -> None:
    """Depth plus level may reach the deepest lineage, not pass it (boundary)."""
    from charter.core.lineage import MAX_LINEAGE_DEPTH

    level = CHILD_LINEAGE.depth
    Grant(**_grant(terms=child_terms(depth=MAX_LINEAGE_DEPTH - level)))
    with pytest.raises(ValidationError, match="deepest lineage"):
        Grant(**_grant(terms=child_terms(depth=MAX_LINEAGE_DEPTH - level + 1)))
    # Expiring at the very instant of issue is allowed; a millisecond before is not.
    Grant(**_grant(issued_at_ms=NOW_MS, terms=child_terms(expires_at_ms=NOW_MS)))
    with pytest.raises(ValidationError, match="expire before"):
        Grant(**_grant(issued_at_ms=NOW_MS + 1, terms=child_terms(expires_at_ms=NOW_MS)))


# -- 6. the fan-out boundary ------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 2, 3, 7])
def test_a_fanout_of_exactly_the_remaining_allowance_fits_and_one_more_does_not(
    width: int,
) -> None:
    parent = terms(fanout=100)
    remaining = 40
    each = (remaining - width) // width
    fitting = child_terms(fanout=each)
    check_invariants(parent, fitting, remaining_fanout=width * (1 + each), width=width)
    with pytest.raises(errors.FanoutNotDecreasingError):
        check_invariants(parent, fitting, remaining_fanout=width * (1 + each) - 1, width=width)
    # A width equal to the remaining fan-out: children with no allowance of their own.
    none_each = child_terms(fanout=0)
    check_invariants(parent, none_each, remaining_fanout=width, width=width)
    with pytest.raises(errors.FanoutNotDecreasingError):
        check_invariants(parent, none_each, remaining_fanout=width - 1, width=width)
    # attenuate hands out exactly the largest allowance that still fits.
    asked = RequestedGrant(fanout=10_000)
    got = attenuate(parent, asked, remaining_fanout=remaining, width=width, now_ms=NOW_MS)
    assert got.fanout == each
    check_invariants(parent, got, remaining_fanout=remaining, width=width)
    assert width * (1 + got.fanout + 1) > remaining  # one more would not have fitted
    asked_none = attenuate(
        parent, RequestedGrant(), remaining_fanout=remaining, width=width, now_ms=NOW_MS
    )
    assert asked_none.fanout == 0


def test_the_depth_boundary_of_check_invariants() -> None:
    parent = terms(depth=3)
    check_invariants(parent, child_terms(depth=2), remaining_fanout=100)
    with pytest.raises(errors.DepthNotDecreasingError):
        check_invariants(parent, child_terms(depth=3), remaining_fanout=100)


def test_attenuate_caps_every_axis_at_the_parent_and_the_lease() -> None:
    parent = terms()
    lease = Budget.parse("tokens=1k,wall=5s,cpu=1s,mem=1MiB,egress=1KB")
    asked = RequestedGrant(
        tools=frozenset({"Read", "Write"}),
        egress=frozenset({"api.example.com", "evil.org"}),
        secrets=frozenset({"GITHUB_TOKEN", "AWS_KEY"}),
        clearance=Clearance.SECRET,
        mode=PermissionMode.BYPASS,
        depth=10,
        budget=BIG,
        ttl_s=60,
    )
    got = attenuate(parent, asked, remaining_fanout=5, width=1, now_ms=NOW_MS, lease=lease)
    assert got.tools == {"Read"}
    assert got.egress == {"api.example.com"}
    assert got.secrets == {"GITHUB_TOKEN"}
    assert got.clearance is Clearance.CONFIDENTIAL
    assert got.mode is PermissionMode.ACCEPT_EDITS
    assert got.depth == 2
    assert got.budget == lease
    assert got.expires_at_ms == NOW_MS + 5_000  # the lease's wall-clock, before the ttl
    longer = attenuate(parent, RequestedGrant(ttl_s=1), remaining_fanout=5, width=1, now_ms=NOW_MS)
    assert longer.expires_at_ms == NOW_MS + 1_000
    # Nothing asked: the parent's values, depth one less.
    same = attenuate(parent, RequestedGrant(), remaining_fanout=5, width=1, now_ms=NOW_MS)
    assert (same.tools, same.egress, same.secrets, same.budget) == (
        parent.tools,
        parent.egress,
        parent.secrets,
        parent.budget,
    )
    assert (same.clearance, same.mode, same.depth, same.expires_at_ms) == (
        parent.clearance,
        parent.mode,
        parent.depth - 1,
        parent.expires_at_ms,
    )
    # Asking for less than the parent holds gets exactly that.
    low = attenuate(
        parent,
        RequestedGrant(clearance=Clearance.PUBLIC, mode=PermissionMode.PLAN, depth=1),
        remaining_fanout=5,
        width=1,
        now_ms=NOW_MS,
    )
    assert (low.clearance, low.mode, low.depth) == (Clearance.PUBLIC, PermissionMode.PLAN, 1)


# -- 7. immutability -------------------------------------------------------------------


def _models() -> list[tuple[Any, str, Any]]:
    sealed = root_grant(ROOT)
    return [
        (terms(), "depth", 99),
        (sealed.grant, "issuer", Lineage.root("x")),
        (sealed, "signature", bytes(64)),
        (Budget.zero(), "tokens", 1),
        (RequestedGrant(), "depth", 1),
        (
            SpawnIntent(
                width=1, objective="o", grant=RequestedGrant(), estimated_cost=Budget.zero()
            ),
            "width",
            9,
        ),
    ]


@pytest.mark.parametrize("index", range(6))
def test_domain_values_are_frozen_and_closed(index: int) -> None:
    model, field, value = _models()[index]
    before = getattr(model, field)
    with pytest.raises(ValidationError, match="frozen"):
        setattr(model, field, value)
    assert getattr(model, field) == before
    with pytest.raises(ValidationError, match="Extra inputs"):
        type(model)(**(model.model_dump() | {"smuggled": 1}))


def test_a_copy_of_terms_or_a_sealed_grant_is_revalidated() -> None:
    """model_copy cannot slip a value past validation or keep a stale encoding."""
    t = terms()
    with pytest.raises(ValidationError):
        t.model_copy(update={"depth": -1})
    wider = t.model_copy(update={"depth": 2})
    assert wider.canonical_bytes != t.canonical_bytes
    assert b'"depth":2' in wider.canonical_bytes
    sealed = root_grant(ROOT)
    other = root_grant(ROOT, t=terms(depth=2))
    copied = sealed.model_copy(update={"body": other.body})
    assert copied.grant.terms.depth == 2
    assert copied.digest != sealed.digest


def test_the_canonical_body_is_the_canonical_json_of_the_grant() -> None:
    """The hand-composed signed bytes equal canonical_json of canonical_dict, for a root
    grant and a child grant."""
    from charter.core.events import canonical_json

    root = root_grant(ROOT)
    child = child_grant(root, child_terms())
    for grant in (root.grant, child.grant):
        assert canonical_json(grant.canonical_dict()) == grant.canonical_body()
    assert child.grant.canonical_dict() == {
        "v": 1,
        "lineage": "agent:root/sa-1",
        "issuer": "agent:root",
        "subject_key": bytes(CHILD_KEY.verify_key).hex(),
        "parent_digest": root.digest.hex(),
        "issued_at_ms": NOW_MS,
        "terms": child_terms().canonical,
    }


def test_attenuate_takes_a_narrower_request_on_the_budget_and_set_axes() -> None:
    parent = terms()
    small = Budget.parse("tokens=1,wall=1ms,cpu=1ms,mem=1B,egress=1B")
    asked = RequestedGrant(budget=small, secrets=frozenset(), tools=frozenset({"Edit"}))
    got = attenuate(parent, asked, remaining_fanout=5, width=1, now_ms=NOW_MS)
    assert got.budget == small
    assert got.secrets == frozenset()
    assert got.tools == {"Edit"}
    assert got.egress == parent.egress
