"""Every named invariant error and every refusal reason: raised by a real spawn, then
found in the journal with its reason code. Each attack sits beside a positive control."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
from nacl.signing import SigningKey

import charter.control.spawn as spawn_module
from charter.authority import (
    Clearance,
    FanoutCommand,
    FixedPolicy,
    Grant,
    GrantTerms,
    ParentState,
    PermissionMode,
    RequestedGrant,
    SealedGrant,
    TrifectaPolicy,
    Verdict,
    attenuate,
    check_trifecta,
    decide,
    errors,
    seal,
)
from charter.control import AgentRecord, Caller, SpawnService, revoke
from charter.core import KeyStore, Lineage
from charter.ledger import Journal
from tests.authority._support import COST, intent, refusals


def broken_attenuator(**widen: object) -> Callable[..., GrantTerms]:
    """An attenuation step with a bug: it widens the child after intersecting."""

    def attenuate_badly(parent: GrantTerms, requested: RequestedGrant, **kw: int) -> GrantTerms:
        child = attenuate(parent, requested, **kw)
        values = {k: (v(parent) if callable(v) else v) for k, v in widen.items()}
        return child.model_copy(update=values)

    return attenuate_badly


INVARIANT_BUGS: dict[type[errors.InvariantViolationError], dict[str, object]] = {
    errors.DepthNotDecreasingError: {"depth": lambda p: p.depth},
    errors.AxisWidenedError: {"tools": lambda p: p.tools | {"Shell"}},
    errors.ClearanceRaisedError: {"clearance": Clearance.SECRET},
    errors.PermissionModeRaisedError: {"mode": PermissionMode.BYPASS},
    errors.FanoutNotDecreasingError: {"fanout": lambda p: p.fanout},
}


def _service(journal: Journal, keystore: KeyStore, **kw: object) -> SpawnService:
    kw.setdefault("policy", FixedPolicy(Verdict.POSITIVE))
    return SpawnService(journal, keystore=keystore, **kw)  # type: ignore[arg-type]


@contextlib.contextmanager
def _attenuating(attenuate_fn: object) -> Iterator[None]:
    """The spawn pipeline's ``decide`` with a broken attenuator: the pure decision takes
    its attenuator as an argument; the product's pipeline never passes another."""
    original = spawn_module.decide

    def buggy(*args: object, **kwargs: object) -> object:
        return original(*args, **{**kwargs, "attenuate_fn": attenuate_fn})  # type: ignore[arg-type]

    spawn_module.decide = buggy  # type: ignore[assignment]
    try:
        yield
    finally:
        spawn_module.decide = original


def _assert_journaled(journal: Journal, error: type[errors.AuthorityRefusedError]) -> None:
    found = [r for r in refusals(journal) if r.error == error.__name__]
    assert found, f"no SpawnRefused for {error.__name__} in the journal"
    assert found[-1].reason == error.reason
    assert found[-1].message


@pytest.mark.parametrize("error", list(INVARIANT_BUGS), ids=lambda e: e.__name__)
def test_each_invariant_catches_a_broken_attenuator_and_is_journaled(
    journal: Journal,
    keystore: KeyStore,
    root: AgentRecord,
    error: type[errors.AuthorityRefusedError],
) -> None:
    del root
    honest = _service(journal, keystore)
    honest.spawn(honest.durable_caller("root"), intent(2))  # positive control
    before = len(list(journal.entries(types=("GrantMinted",))))
    with _attenuating(broken_attenuator(**INVARIANT_BUGS[error])), pytest.raises(error):
        honest.spawn(honest.durable_caller("root"), intent(2))
    _assert_journaled(journal, error)
    assert len(list(journal.entries(types=("GrantMinted",)))) == before  # nothing minted


def test_other_widened_axes_are_caught_too(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    del root
    for widen in (
        {"egress": frozenset({"evil.net"})},
        {"secrets": frozenset({"GITHUB_TOKEN", "ROOT_PASSWORD"})},
        {"budget": lambda p: p.budget + p.budget},
        {"expires_at_ms": lambda p: p.expires_at_ms + 1},
    ):
        svc = _service(journal, keystore)
        with (
            _attenuating(broken_attenuator(**widen)),
            pytest.raises(
                errors.AxisWidenedError, match=next(iter(widen)).replace("expires_at_ms", "expiry")
            ),
        ):
            svc.spawn(svc.durable_caller("root"), intent(1))


# -- refusals of what may be spawned ------------------------------------------------


def test_depth_exhausted(service: SpawnService, journal: Journal) -> None:
    root = service.durable_caller("root")
    leaf = root.child(service.spawn(root, intent(1, depth=0)).children[0])
    assert leaf.chain[-1].grant.terms.depth == 0
    deeper = root.child(service.spawn(root, intent(1, depth=1)).children[0])
    service.spawn(deeper, intent(1))  # positive control: depth 1 may spawn
    with pytest.raises(errors.DepthExhaustedError):
        service.spawn(leaf, intent(1))
    _assert_journaled(journal, errors.DepthExhaustedError)


def test_fanout_exhausted_and_width_counts_against_the_parent(
    service: SpawnService, journal: Journal
) -> None:
    root = service.durable_caller("root")
    worker = root.child(service.spawn(root, intent(1, fanout=5)).children[0])
    assert worker.chain[-1].grant.terms.fanout == 5
    small = COST.split(64 * 4)  # within the worker's lease (COST / 64), for each fan-out
    first = service.spawn(worker, intent(3, cost=small))
    assert [str(c.lineage).rsplit("/", 1)[1] for c in first.children] == ["sa-1", "sa-2", "sa-3"]
    # Each child's allowance is carved out of what its parent has left: (5 - 3) // 3 = 0
    # each, so the three children hold 3 of the worker's 5.
    assert {c.grant.terms.fanout for c in first.children} == {0}
    with pytest.raises(errors.FanoutExhaustedError, match="wider than the 2"):
        service.spawn(worker, intent(3, cost=small))
    _assert_journaled(journal, errors.FanoutExhaustedError)
    service.spawn(worker, intent(2, cost=small))  # exactly what remains is allowed
    with pytest.raises(errors.FanoutExhaustedError, match="wider than the 0"):
        service.spawn(worker, intent(1, cost=small))


def test_expired_grant_cannot_spawn(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    del root
    clock = [1_800_000_000_000]
    svc = _service(journal, keystore, clock=lambda: clock[0])
    caller = svc.durable_caller("root")
    worker = caller.child(svc.spawn(caller, intent(1, ttl_s=60)).children[0])
    svc.spawn(worker, intent(1))  # positive control, within the minute
    clock[0] += 61_000
    with pytest.raises(errors.GrantExpiredError):
        svc.spawn(worker, intent(1))
    _assert_journaled(journal, errors.GrantExpiredError)


# -- refusals by the gate -------------------------------------------------------------


class Raising:
    name = "raising"

    def judge(self, question: object) -> object:
        raise RuntimeError("model endpoint down")


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        (FixedPolicy(Verdict.NEGATIVE), errors.GateRefusedError),
        (FixedPolicy(Verdict.UNKNOWN), errors.GateUnknownError),
        (Raising(), errors.GateUnknownError),
    ],
    ids=["negative", "unknown", "raising"],
)
def test_gate_refusals_are_journaled_with_the_gate_decision(
    journal: Journal,
    keystore: KeyStore,
    root: AgentRecord,
    policy: object,
    error: type[errors.AuthorityRefusedError],
) -> None:
    del root
    svc = _service(journal, keystore, policy=policy)
    with pytest.raises(error):
        svc.spawn(svc.durable_caller("root"), intent(4))
    _assert_journaled(journal, error)
    gate = [e.event for e in journal.entries(types=("GateDecided",))]
    assert len(gate) == 1
    assert gate[0].verdict in (Verdict.NEGATIVE, Verdict.UNKNOWN)  # type: ignore[attr-defined]
    assert list(journal.entries(types=("GrantMinted",)))[1:] == []  # only the root's


# -- refusals of who is asking ----------------------------------------------------------


def _tamper(sealed: SealedGrant, **terms: object) -> Grant:
    grant = sealed.grant
    return grant.model_copy(update={"terms": grant.terms.model_copy(update=terms)})


def test_forged_grant_is_refused(service: SpawnService, journal: Journal) -> None:
    root = service.durable_caller("root")
    worker = root.child(service.spawn(root, intent(1, tools=["Read"])).children[0])
    service.spawn(worker, intent(1))  # positive control
    widened = _tamper(worker.chain[-1], tools=frozenset({"Read", "Bash"}))
    forged = SealedGrant(body=widened.canonical_body(), signature=worker.chain[-1].signature)
    with pytest.raises(errors.GrantSignatureInvalidError):
        service.spawn(Caller((*worker.chain[:-1], forged), worker.custody_key), intent(1))
    _assert_journaled(journal, errors.GrantSignatureInvalidError)


def test_resigned_grant_is_refused(service: SpawnService, journal: Journal) -> None:
    """The holder widens its own grant and signs it with its own key."""
    root = service.durable_caller("root")
    worker = root.child(service.spawn(root, intent(1, tools=["Read"])).children[0])
    widened = _tamper(worker.chain[-1], tools=frozenset({"Read", "Bash"}))
    resigned = seal(widened, worker.custody_key)
    with pytest.raises(errors.GrantSignatureInvalidError):
        service.spawn(Caller((*worker.chain[:-1], resigned), worker.custody_key), intent(1))
    _assert_journaled(journal, errors.GrantSignatureInvalidError)


def test_grant_from_another_root_is_refused(service: SpawnService, journal: Journal) -> None:
    """An outsider's key signs a root grant for agent:root and a child under it."""
    outsider = SigningKey.generate()
    fake_root = seal(
        Grant(
            lineage=Lineage("agent:root"),
            issuer=Lineage("agent:root"),
            subject_key=bytes(outsider.verify_key).hex(),
            parent_digest=None,
            issued_at_ms=0,
            terms=service.durable_caller("root").chain[0].grant.terms,
        ),
        outsider,
    )
    seed = bytes(outsider)
    made = decide(
        ParentState(fake_root, seed, minted=0, reserved=0, version=2),
        FanoutCommand("f", intent(1), service.clock()),
        policy=FixedPolicy(Verdict.POSITIVE),
    )
    caller = Caller((fake_root,), outsider).child(made.children[0])
    with pytest.raises(errors.ForeignRootError):
        service.spawn(caller, intent(1))
    _assert_journaled(journal, errors.ForeignRootError)


def test_chain_that_does_not_link_is_refused(service: SpawnService, journal: Journal) -> None:
    root = service.durable_caller("root")
    result = service.spawn(root, intent(2))
    a, b = (root.child(c) for c in result.children)
    grandchild = a.child(service.spawn(a, intent(1, cost=COST.split(64 * 4))).children[0])
    # b's grant spliced in as the middle link of a's grandchild's chain.
    spliced = Caller((root.chain[0], b.chain[-1], grandchild.chain[-1]), grandchild.custody_key)
    with pytest.raises(errors.GrantChainBrokenError):
        service.spawn(spliced, intent(1))
    _assert_journaled(journal, errors.GrantChainBrokenError)
    with pytest.raises(errors.GrantChainBrokenError):
        service.spawn(Caller((), root.custody_key), intent(1))


def test_grant_never_journaled_is_refused(service: SpawnService, journal: Journal) -> None:
    """A correctly signed child that was decided but never committed carries nothing."""
    root = service.durable_caller("root")
    seed = bytes(root.custody_key)
    uncommitted = decide(
        ParentState(root.chain[0], seed, minted=99, reserved=99, version=2),
        FanoutCommand("f", intent(1), service.clock()),
        policy=FixedPolicy(Verdict.POSITIVE),
    )
    with pytest.raises(errors.GrantNotJournaledError):
        service.spawn(root.child(uncommitted.children[0]), intent(1))
    _assert_journaled(journal, errors.GrantNotJournaledError)


def test_custody_key_not_the_grants_key_is_refused(service: SpawnService, journal: Journal) -> None:
    root = service.durable_caller("root")
    worker = root.child(service.spawn(root, intent(1)).children[0])
    with pytest.raises(errors.CustodyKeyMismatchError):
        service.spawn(Caller(worker.chain, SigningKey.generate()), intent(1))
    with pytest.raises(errors.CustodyKeyMismatchError):
        service.spawn(Caller(root.chain, SigningKey.generate()), intent(1))
    _assert_journaled(journal, errors.CustodyKeyMismatchError)


def test_unknown_parent_is_refused(service: SpawnService, journal: Journal) -> None:
    ghost_key = SigningKey.generate()
    ghost = seal(
        Grant(
            lineage=Lineage("agent:ghost"),
            issuer=Lineage("agent:ghost"),
            subject_key=bytes(ghost_key.verify_key).hex(),
            parent_digest=None,
            issued_at_ms=0,
            terms=service.durable_caller("root").chain[0].grant.terms,
        ),
        ghost_key,
    )
    with pytest.raises(errors.UnknownParentError):
        service.spawn(Caller((ghost,), ghost_key), intent(1))
    _assert_journaled(journal, errors.UnknownParentError)


def test_a_revoked_lineage_and_its_subtree_cannot_spawn(
    service: SpawnService, journal: Journal
) -> None:
    root = service.durable_caller("root")
    child = root.child(service.spawn(root, intent(1)).children[0])
    grandchild = child.child(service.spawn(child, intent(1)).children[0])
    service.spawn(grandchild, intent(1))  # the control: it may, until the revocation
    assert revoke(journal, service.views, Lineage(child.claimed), "test") is not None
    for caller in (child, grandchild):
        with pytest.raises(errors.LineageRevokedError):
            service.spawn(caller, intent(1))
    _assert_journaled(journal, errors.LineageRevokedError)
    assert revoke(journal, service.views, Lineage(child.claimed), "again") is None
    service.spawn(root, intent(1))  # above the revoked lineage, nothing changed


def test_a_mint_racing_a_revocation_is_refused(service: SpawnService, journal: Journal) -> None:
    """The revocation commits between a grandchild's decision and its append: the
    append is pinned to every ancestor's stream, the revoked one's included, so it does
    not commit, and the decision made again is refused."""
    root = service.durable_caller("root")
    child = root.child(service.spawn(root, intent(1)).children[0])
    grandchild = child.child(service.spawn(child, intent(1)).children[0])
    racing = [child.claimed]
    original = spawn_module.decide

    def decide_then_revoke(*args: object, **kwargs: object) -> object:
        decision = original(*args, **kwargs)  # type: ignore[arg-type]
        while racing:  # lands between the decision and its append
            other = SpawnService(journal, keystore=service.keystore)
            revoke(journal, other.views, Lineage(racing.pop()), "racing")
        return decision

    spawn_module.decide = decide_then_revoke  # type: ignore[assignment]
    try:
        with pytest.raises(errors.LineageRevokedError):
            service.spawn(grandchild, intent(1))
    finally:
        spawn_module.decide = original
    minted = [str(e.event.lineage) for e in journal.entries(types=("GrantMinted",))]  # type: ignore[attr-defined]
    assert not any(m.startswith(grandchild.claimed + "/") for m in minted)


def test_every_refusal_class_is_exercised_here() -> None:
    """A new refusal class must get a test in this module."""
    concrete = {
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type)
        and issubclass(cls, errors.AuthorityRefusedError)
        and cls not in (errors.AuthorityRefusedError, errors.InvariantViolationError)
    }
    with open(__file__, encoding="utf-8") as f:
        source = f.read()
    # Each is named either in a pytest.raises here or in a table a test is driven by.
    missing = {c.__name__ for c in concrete if f"errors.{c.__name__}" not in source}
    assert missing == set()
    reasons = [c.reason for c in concrete]
    assert len(reasons) == len(set(reasons))  # each reason code means one thing


def test_a_grant_holding_the_lethal_trifecta_is_refused_unless_the_policy_names_it() -> None:
    """The mint's trifecta check (the spawn path's and the door's are in
    test_trifecta.py): private data, an untrusted source and a way out at once are
    refused; the same grant without the private destination, or named by the policy,
    is not (the controls)."""
    child = Lineage("agent:estate/sa-1")
    egress = ("10.0.0.7:8443", "pypi.org")
    with pytest.raises(errors.LethalTrifectaError) as refused:
        check_trifecta(child, egress, (), TrifectaPolicy())
    assert refused.value.reason == "lethal-trifecta"
    check_trifecta(child, ("pypi.org",), (), TrifectaPolicy())  # no private data
    check_trifecta(child, egress, (), TrifectaPolicy(allow=frozenset({"agent:estate"})))
