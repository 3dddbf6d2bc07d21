"""Sealed grants and the custody check, attacked offline beside positive controls."""

from __future__ import annotations

import pytest
from nacl.signing import SigningKey

from charter.authority import (
    AgentRegistered,
    FanoutCommand,
    FixedPolicy,
    GrantMinted,
    ParentState,
    SealedGrant,
    Verdict,
    check_custody,
    decide,
    errors,
    verify_grant_chain,
)
from charter.control import AgentRecord, SpawnService
from charter.core import KeyStore
from charter.ledger import Journal
from tests.authority._support import NOW_MS, intent, refusals, root_grant, terms

ROOT = SigningKey(b"\x01" * 32)
OTHER = SigningKey(b"\x02" * 32)


def chain_of(key: SigningKey, depth: int, name: str = "root") -> list[SealedGrant]:
    chain = [root_grant(key, name)]
    seed = bytes(key)
    for _ in range(depth):
        d = decide(
            ParentState(chain[-1], seed, minted=0, reserved=0, version=1),
            FanoutCommand("f", intent(1), NOW_MS),
            policy=FixedPolicy(Verdict.POSITIVE),
        )
        chain.append(d.children[0].sealed)
        seed = d.children[0].seed
    return chain


def test_a_chain_verifies_with_only_the_grants_and_the_roots_public_key() -> None:
    chain = chain_of(ROOT, 3)
    leaf = verify_grant_chain(chain, bytes(ROOT.verify_key), now_ms=NOW_MS)
    assert str(leaf.lineage) == "agent:root/sa-1/sa-1/sa-1"
    # From stored records too (what the journal holds).
    again = [SealedGrant.from_record(s.to_record()) for s in chain]
    assert verify_grant_chain(again, bytes(ROOT.verify_key)) == leaf


def test_every_flipped_body_byte_or_signature_byte_is_refused() -> None:
    chain = chain_of(ROOT, 1)
    leaf = chain[-1]
    for i in range(len(leaf.signature)):
        sig = bytearray(leaf.signature)
        sig[i] ^= 0x01
        with pytest.raises(errors.GrantSignatureInvalidError):
            verify_grant_chain(
                [chain[0], SealedGrant(body=leaf.body, signature=bytes(sig))],
                bytes(ROOT.verify_key),
            )
    refused = 0
    for i in range(len(leaf.body)):
        body = bytearray(leaf.body)
        body[i] ^= 0x01
        try:
            forged = SealedGrant(body=bytes(body), signature=leaf.signature)
            verify_grant_chain([chain[0], forged], bytes(ROOT.verify_key))
        except (errors.GrantFormatError, errors.AuthorityRefusedError):
            refused += 1
    assert refused == len(leaf.body)


def test_a_chain_from_another_root_is_refused() -> None:
    other = chain_of(OTHER, 2)
    verify_grant_chain(other, bytes(OTHER.verify_key))  # positive control: valid for its own root
    with pytest.raises(errors.ForeignRootError):
        verify_grant_chain(other, bytes(ROOT.verify_key))
    # Another root's worker grafted under this root's ceiling grant.
    mine = chain_of(ROOT, 1)
    with pytest.raises(errors.GrantChainBrokenError):
        verify_grant_chain([mine[0], *other[1:]], bytes(ROOT.verify_key))


def test_chain_must_start_at_a_root_and_link_by_digest() -> None:
    chain = chain_of(ROOT, 2)
    with pytest.raises(errors.GrantChainBrokenError, match="start at a root"):
        verify_grant_chain(chain[1:], bytes(ROOT.verify_key))
    with pytest.raises(errors.GrantChainBrokenError, match="empty"):
        verify_grant_chain([], bytes(ROOT.verify_key))
    # The same lineage minted from a different version of the root grant.
    other_root = root_grant(ROOT, t=terms(depth=4))
    with pytest.raises(errors.GrantChainBrokenError, match="different parent grant"):
        verify_grant_chain([other_root, *chain[1:]], bytes(ROOT.verify_key))


def test_expired_links_are_refused_when_time_is_given() -> None:
    chain = chain_of(ROOT, 1)
    expiry = chain[-1].grant.terms.expires_at_ms
    verify_grant_chain(chain, bytes(ROOT.verify_key), now_ms=expiry - 1)
    with pytest.raises(errors.GrantExpiredError):
        verify_grant_chain(chain, bytes(ROOT.verify_key), now_ms=expiry)


def test_non_canonical_bytes_are_not_a_grant() -> None:
    sealed = chain_of(ROOT, 0)[0]
    spaced = sealed.body.replace(b'"v":1', b'"v": 1')
    with pytest.raises(errors.GrantFormatError, match="canonical"):
        SealedGrant(body=spaced, signature=sealed.signature)
    with pytest.raises(errors.GrantFormatError):
        SealedGrant.from_record({"body": "{}", "signature": "00" * 64})
    with pytest.raises(errors.GrantFormatError):
        SealedGrant.from_record({"body": sealed.body.decode(), "signature": "zz"})


def test_custody_key_one_byte_off_its_trust_root_is_refused_at_every_position() -> None:
    trust_root = bytes(ROOT.verify_key)
    check_custody(trust_root, bytes(trust_root), who="agent:root")  # positive control
    for i in range(len(trust_root)):
        off = bytearray(trust_root)
        off[i] ^= 0x80
        with pytest.raises(errors.CustodyKeyMismatchError):
            check_custody(bytes(off), trust_root, who="agent:root")


def test_directory_trust_root_one_byte_off_the_custody_key_is_a_journaled_refusal(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    """The custody key in the home and the trust root in the directory differ in one
    byte: the durable agent cannot act, and the refusal is in the journal."""
    svc = SpawnService(journal, keystore=keystore, policy=FixedPolicy(Verdict.POSITIVE))
    svc.spawn(svc.durable_caller("root"), intent(1))  # positive control
    # A second agent whose directory entry is one byte off its key's public half.
    key = keystore.create("agent-skewed")
    off = bytearray(bytes(key.verify_key))
    off[17] ^= 0x01
    ceiling = root_grant(key, "skewed")
    journal.append(
        [
            AgentRegistered(name="skewed", lineage="agent:skewed", trust_root=bytes(off).hex()),
            GrantMinted.of("register:skewed", ceiling),
        ]
    )
    with pytest.raises(errors.CustodyKeyMismatchError):
        svc.durable_caller("skewed")
    found = [r for r in refusals(journal) if r.reason == "custody-key-mismatch"]
    assert [r.actor for r in found] == ["agent:skewed"]


def test_replaced_custody_key_file_is_refused(
    journal: Journal, keystore: KeyStore, root: AgentRecord
) -> None:
    svc = SpawnService(journal, keystore=keystore)
    keystore.remove("agent-root")
    keystore.create("agent-root")  # a different key under the same name
    with pytest.raises(errors.CustodyKeyMismatchError):
        svc.durable_caller("root")
    assert [r.reason for r in refusals(journal)] == ["custody-key-mismatch"]
    assert root.trust_root != bytes(keystore.load("agent-root").verify_key)
