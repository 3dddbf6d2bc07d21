"""Known-answer vectors beyond tests/core/test_framing.py: a whole sealed grant (its
canonical body, Ed25519 signature and digest), the entry hash at the edges of its fixed
width fields, and the child-key derivation down a lineage.

Each value is pinned as a literal and recomputed here independently (hashlib, hmac,
struct, pynacl over tags spelled out by hand), so a change to the encoding, a tag, a
length prefix or the derivation fails the test even if the code agrees with itself.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
from nacl.signing import SigningKey

from charter.authority import (
    Clearance,
    Grant,
    GrantTerms,
    PermissionMode,
    SealedGrant,
    derive_child_seed,
    seal,
    verify_grant_chain,
)
from charter.core import Budget, Lineage, framing

KEY = SigningKey(bytes(range(32)))
PUBLIC_HEX = "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8"
BODY = (
    '{"issued_at_ms":1700000000000,"issuer":"agent:estate","lineage":"agent:estate",'
    '"parent_digest":null,"subject_key":"' + PUBLIC_HEX + '","terms":{"budget":'
    '{"cpu_ms":60000,"egress_bytes":20000000,"mem_bytes":536870912,"tokens":200000,'
    '"wall_ms":600000},"clearance":"internal","depth":2,"egress":["*.example.com",'
    '"pypi.org"],"expires_at_ms":1800000000000,"fanout":7,"mode":"default","secrets":'
    '["GITHUB_TOKEN"],"tools":["Bash","Read"]},"v":1}'
).encode()
SIGNATURE_HEX = (
    "8b15ab256732fd8de38afe1054b721ef7cd7f3b14034906f7affe7243e72cd9b"
    "b3cf8cdcf55324e1405c8ec81d65765af10b52012b737e53e7c307b1d1466c0d"
)
DIGEST_HEX = "697aa6df77a66e84055ccdcc12f9714a46ccad3b206b6b443d1f6909c634edfb"


def _grant() -> Grant:
    terms = GrantTerms(
        tools=frozenset({"Read", "Bash"}),
        # api.example.com is covered by *.example.com: stored as the one rule.
        egress=frozenset({"*.example.com", "api.example.com", "pypi.org"}),
        secrets=frozenset({"GITHUB_TOKEN"}),
        clearance=Clearance.INTERNAL,
        mode=PermissionMode.DEFAULT,
        depth=2,
        fanout=7,
        budget=Budget.parse("tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB"),
        expires_at_ms=1_800_000_000_000,
    )
    root = Lineage.root("estate")
    return Grant(
        lineage=root,
        issuer=root,
        subject_key=bytes(KEY.verify_key).hex(),
        parent_digest=None,
        issued_at_ms=1_700_000_000_000,
        terms=terms,
    )


def test_a_sealed_grant_vector() -> None:
    sealed = seal(_grant(), KEY)
    assert bytes(KEY.verify_key).hex() == PUBLIC_HEX
    assert sealed.body == BODY
    # Signed over the grant tag and the body, by the issuer's key (Ed25519 is deterministic).
    assert sealed.signature == KEY.sign(b"charter/grant/v1\x00" + BODY).signature
    assert sealed.signature.hex() == SIGNATURE_HEX
    # Named by sha256(digest tag ‖ u32 len‖body ‖ signature).
    want = hashlib.sha256(
        b"charter/grant-digest/v1\x00" + struct.pack(">I", len(BODY)) + BODY + sealed.signature
    ).digest()
    assert sealed.digest == want
    assert sealed.digest.hex() == DIGEST_HEX
    # The stored record reads back to the same grant, which verifies offline.
    again = SealedGrant.from_record(
        {"body": BODY.decode(), "signature": SIGNATURE_HEX},
    )
    assert again.grant == _grant()
    assert verify_grant_chain([again], bytes.fromhex(PUBLIC_HEX)) == _grant()


def _ref_entry(
    prev: bytes, position: int, originator: bytes, version: int, topic: bytes, state: bytes
) -> bytes:
    return hashlib.sha256(
        b"charter/entry/v1\x00"
        + prev
        + struct.pack(">Q", position)
        + struct.pack(">H", len(originator))
        + originator
        + struct.pack(">q", version)
        + struct.pack(">I", len(topic))
        + topic
        + struct.pack(">I", len(state))
        + state
    ).digest()


EDGES = [
    # the largest position, an empty originator, topic and state, a negative version
    (
        (b"\xff" * 32, 2**64 - 1, b"", -1, b"", b""),
        "24633d726c1e5fd4c4aca25a01a227edcd13a607f87730f634b9dd0a3c1008a9",
    ),
    # the largest version, a state longer than 255 bytes (a multi-byte length)
    (
        (bytes(32), 1, bytes(16), 2**63 - 1, b"T", bytes(1000)),
        "7f47f0f019150613ed077cf716b43cf56bdce3f1ef2a6459e03739242773ff97",
    ),
]


@pytest.mark.parametrize(("fields", "expected"), EDGES)
def test_entry_hash_vectors_at_the_edges_of_its_fields(
    fields: tuple[bytes, int, bytes, int, bytes, bytes], expected: str
) -> None:
    got = framing.entry_hash(*fields)
    assert got == _ref_entry(*fields)
    assert got.hex() == expected


def test_entry_hash_refuses_what_its_fields_cannot_hold() -> None:
    """Out of range is an error, never a silently wrapped or truncated field."""
    for fields in (
        (bytes(32), 2**64, b"", 0, b"", b""),
        (bytes(32), -1, b"", 0, b"", b""),
        (bytes(32), 1, b"", 2**63, b"", b""),
        (bytes(32), 1, bytes(2**16), 0, b"", b""),
    ):
        with pytest.raises(struct.error):
            framing.entry_hash(*fields)


CHILD_SEEDS = [
    (
        bytes(32),
        "agent:estate",
        "7f1c03009d7116853a3b8d8d6648eefe0f1a7e62b7f8aed306f43e2fd597411a",
    ),
    (
        b"\x07" * 32,
        "agent:estate/sa-1/sa-2/sa-3",
        "493a32961a4df4e702181806a2f2fd312b0f01fd7a8e04efc3f6bd820cf4e633",
    ),
]


@pytest.mark.parametrize(("parent", "lineage", "expected"), CHILD_SEEDS)
def test_child_seed_vectors(parent: bytes, lineage: str, expected: str) -> None:
    want = hmac.new(parent, b"charter/custody/child/v1\x00" + lineage.encode(), "sha256")
    assert framing.child_seed(parent, lineage) == want.digest()
    assert framing.child_seed(parent, lineage).hex() == expected
    assert derive_child_seed(parent, Lineage(lineage)).hex() == expected


def test_child_seeds_differ_by_parent_and_by_lineage() -> None:
    a = framing.child_seed(bytes(32), "agent:estate/sa-1")
    assert a != framing.child_seed(b"\x01" + bytes(31), "agent:estate/sa-1")
    assert a != framing.child_seed(bytes(32), "agent:estate/sa-10")
    assert len(a) == 32
