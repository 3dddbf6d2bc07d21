"""Properties of attenuation, over thousands of arbitrary parents and requests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from charter.authority import (
    FanoutCommand,
    FixedPolicy,
    Grant,
    GrantTerms,
    ParentState,
    RequestedGrant,
    SealedGrant,
    SpawnIntent,
    Verdict,
    attenuate,
    check_invariants,
    decide,
    egress_within,
    verify_grant_chain,
)
from charter.core import Lineage, canonical_json
from tests.authority._support import (
    COST,
    NOW_MS,
    grant_terms,
    requested_grants,
    root_grant,
)

ROOT_KEY = SigningKey(b"\x07" * 32)


def within_everywhere(child: GrantTerms, parent: GrantTerms) -> bool:
    """Independent of check_invariants: every axis, spelled out again."""
    return (
        child.tools <= parent.tools
        and egress_within(child.egress, parent.egress)
        and child.secrets <= parent.secrets
        and child.clearance.rank <= parent.clearance.rank
        and child.mode.rank <= parent.mode.rank
        and child.depth < parent.depth
        and child.fanout < parent.fanout
        and child.budget.fits_within(parent.budget)
        and child.expires_at_ms <= parent.expires_at_ms
    )


@settings(max_examples=2000, deadline=None)
@given(grant_terms, requested_grants, st.data())
def test_every_attenuated_child_lies_within_its_parent(
    parent: GrantTerms, requested: RequestedGrant, data: st.DataObject
) -> None:
    width = data.draw(st.integers(1, parent.fanout))
    child = attenuate(parent, requested, remaining_fanout=parent.fanout, width=width, now_ms=NOW_MS)
    check_invariants(parent, child, remaining_fanout=parent.fanout)
    assert within_everywhere(child, parent)
    assert child.fanout <= parent.fanout - width  # the width counts against the parent


@settings(max_examples=2000, deadline=None)
@given(grant_terms, requested_grants)
def test_a_request_within_the_parent_is_granted_exactly(
    parent: GrantTerms, requested: RequestedGrant
) -> None:
    """Intersection loses nothing the parent could give (it is the meet, not just any
    narrower value): granting the child's own terms back gives the same terms."""
    child = attenuate(parent, requested, remaining_fanout=parent.fanout, width=1, now_ms=NOW_MS)
    again = RequestedGrant(
        tools=child.tools,
        egress=child.egress,
        secrets=child.secrets,
        clearance=child.clearance,
        mode=child.mode,
        depth=child.depth,
        fanout=child.fanout,
        budget=child.budget,
    )
    same = attenuate(parent, again, remaining_fanout=parent.fanout, width=1, now_ms=NOW_MS)
    assert same.model_copy(update={"expires_at_ms": child.expires_at_ms}) == child


def _wider_than(grant: GrantTerms, root: GrantTerms) -> list[str]:
    return [
        axis
        for axis, ok in (
            ("tools", grant.tools <= root.tools),
            ("egress", egress_within(grant.egress, root.egress)),
            ("secrets", grant.secrets <= root.secrets),
            ("clearance", grant.clearance.rank <= root.clearance.rank),
            ("mode", grant.mode.rank <= root.mode.rank),
            ("depth", grant.depth <= root.depth),
            ("fanout", grant.fanout <= root.fanout),
            ("budget", grant.budget.fits_within(root.budget)),
            ("expiry", grant.expires_at_ms <= root.expires_at_ms),
        )
        if not ok
    ]


@settings(max_examples=800, deadline=None)
@given(grant_terms, st.lists(st.tuples(requested_grants, st.integers(1, 3)), max_size=12))
def test_no_sequence_of_spawns_widens_the_root_and_every_chain_ends(
    root_terms: GrantTerms, steps: list[tuple[RequestedGrant, int]]
) -> None:
    """Spawn down a chain with the real decide (gate, mint, sign) and verify it offline."""
    root = root_grant(ROOT_KEY, t=root_terms)
    chain: list[SealedGrant] = [root]
    seed = bytes(ROOT_KEY)
    policy = FixedPolicy(Verdict.POSITIVE)
    spawned = 0
    for requested, width in steps:
        holder = chain[-1]
        state = ParentState(holder, seed, minted=0, reserved=0, version=1)
        intent = SpawnIntent(width=width, objective="x y z", grant=requested, estimated_cost=COST)
        decision = decide(state, FanoutCommand("f", intent, NOW_MS), policy=policy)
        if decision.refusal is not None:
            # Only the structural limits may refuse a well-formed request here.
            # (and a grant whose lease had no wall-clock time is over as it was made).
            assert decision.refusal.reason in {
                "depth-exhausted",
                "fanout-exhausted",
                "grant-expired",
            }
            break
        spawned += 1
        assert len(decision.children) == width
        for child in decision.children:
            assert within_everywhere(child.grant.terms, holder.grant.terms)
            assert _wider_than(child.grant.terms, root_terms) == []
        chosen = decision.children[-1]
        chain.append(chosen.sealed)
        seed = chosen.seed
        # A grant is its lease: one with no wall-clock time left is over as it is made.
        at = NOW_MS if chosen.grant.terms.expires_at_ms > NOW_MS else None
        leaf = verify_grant_chain(chain, bytes(ROOT_KEY.verify_key), now_ms=at)
        assert leaf == chosen.grant
    # Depth strictly decreases, so no chain is longer than the root's depth.
    assert spawned <= root_terms.depth
    assert len(chain) - 1 == spawned


@settings(max_examples=2000, deadline=None)
@given(grant_terms, st.booleans(), st.integers(0, 2**40))
def test_canonical_body_is_canonical_json(terms: GrantTerms, is_root: bool, at: int) -> None:
    lineage = Lineage("agent:root") if is_root else Lineage("agent:root/sa-1")
    grant = Grant(
        lineage=lineage,
        issuer=Lineage("agent:root"),
        subject_key="ab" * 32,
        parent_digest=None if is_root else "cd" * 32,
        issued_at_ms=min(at, terms.expires_at_ms),
        terms=terms,
    )
    body = grant.canonical_body()
    assert body == canonical_json(grant.canonical_dict())
    assert Grant.from_body(body) == grant
