"""Known-answer vectors for every hash and signature domain in charter.core.framing.

Each expected value is computed twice: once by an independent re-implementation of the
documented framing written here (hashlib, hmac, struct, literal tags), and once pinned
as a hex literal. A change of a single byte in any tag, length prefix or field order
fails the literal; a change that both the code and this file would agree on (the tag
constants) still fails it, because the tags are spelled out here, not imported.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import struct
import uuid
from typing import Any

import pytest
from nacl.signing import SigningKey

from charter.authority import derive_child_seed
from charter.control import WorkerSpec
from charter.core import Budget, BudgetSyntaxError, Event, Lineage, framing
from charter.ledger import Journal
from charter.sandbox import KeyBroker, framed, verify_signature

# The tags as documented in the module's table, written out by hand.
TAGS = {
    "ENTRY_TAG": b"charter/entry/v1\x00",
    "SIGNATURE_TAG": b"charter/grant/v1\x00",
    "DIGEST_TAG": b"charter/grant-digest/v1\x00",
    "CHILD_KEY_TAG": b"charter/custody/child/v1\x00",
    "SANDBOX_KEY_TAG": b"charter/sandbox-key/v1\x00",
    "WORKER_INPUTS_TAG": b"charter/worker-inputs/v1\x00",
    "ROTATION_TAG": b"charter/journal-key-rotation/v1\x00",
}

PREV = bytes(range(32))
ORIGINATOR = bytes.fromhex("00112233445566778899aabbccddeeff")
BODY = b'{"lineage":"agent:estate/sa-1"}'
SIGNATURE = bytes(range(64))
PARENT_SEED = bytes(range(100, 132))


# -- independent re-implementations of the documented framings ---------------------------


def ref_entry_hash(
    prev: bytes, position: int, originator: bytes, version: int, topic: bytes, state: bytes
) -> bytes:
    """sha256(tag ‖ prev ‖ u64 position ‖ u16 len‖originator ‖ i64 version ‖ u32 len‖topic
    ‖ u32 len‖state), big-endian."""
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


def ref_grant_signing_input(body: bytes) -> bytes:
    return b"charter/grant/v1\x00" + body


def ref_grant_digest(body: bytes, signature: bytes) -> bytes:
    return hashlib.sha256(
        b"charter/grant-digest/v1\x00" + struct.pack(">I", len(body)) + body + signature
    ).digest()


def ref_child_seed(parent_seed: bytes, lineage: str) -> bytes:
    return hmac.new(
        parent_seed, b"charter/custody/child/v1\x00" + lineage.encode("utf-8"), hashlib.sha256
    ).digest()


def ref_sandbox_key_signing_input(tag: bytes, message: bytes) -> bytes:
    return (
        b"charter/sandbox-key/v1\x00"
        + struct.pack(">I", len(tag))
        + tag
        + struct.pack(">Q", len(message))
        + message
    )


def ref_worker_inputs_digest(argv: tuple[str, ...], inputs: tuple[str, ...]) -> bytes:
    framed = b"charter/worker-inputs/v1\x00"
    for group in (argv, inputs):
        framed += struct.pack(">I", len(group))
        for arg in group:
            framed += struct.pack(">I", len(arg.encode("utf-8"))) + arg.encode("utf-8")
    return hashlib.sha256(framed).digest()


def ref_key_rotation_signing_input(origin: str, old: bytes, new: bytes) -> bytes:
    raw = origin.encode("utf-8")
    return b"charter/journal-key-rotation/v1\x00" + struct.pack(">H", len(raw)) + raw + old + new


# -- the vectors -----------------------------------------------------------------------

ENTRY_HEX = "d15de77c73bb72a6e517a37ea40a23c8f85870ab019f21a6cc2fe041ed77b110"
ENTRY_GENESIS_HEX = "7ae1db1c63cf542408507239c907f0e572c3cd5e919e0aedc1074f1a9edd9d10"
SIGNING_INPUT_HEX = (
    "636861727465722f6772616e742f7631007b226c696e65616765223a226167656e743a6573746174652f"
    "73612d31227d"
)
DIGEST_HEX = "bf5a5c4a0d5fd0bef33ecbca067b216a0b92e77a5be00e9a35e32c07bae41d32"
CHILD_SEED_HEX = "0135c84230cc293fe76e1764716ef1f3e0dbdfce43bef6039ebe669deadee225"
GRANDCHILD_SEED_HEX = "ba433d5db7acac0ee608dbdfd75093c2b05b9cc856417ec70785d4b7751fdb6c"
CHILD_PUBLIC_HEX = "f7f0ee0b350d30235bdccaed87e7a32a68ff45849d3c5b4d3a2928bce1db47e9"
GRANDCHILD_PUBLIC_HEX = "cdf42aa9a7410e40ccebe5fa5b47d6b8fe6c9a418bd9516533f6cea6bc5a8cf6"
SANDBOX_INPUT_HEX = (
    "636861727465722f73616e64626f782d6b65792f7631000000000a6769742f636f6d6d69740000000000"
    "00000b68656c6c6f00776f726c64"
)

# Computed by the digest as it stood in charter/control/workers.py before the tag moved
# here: journals written then keep their WorkerScheduled.inputs_digest.
WORKER_ARGV = ("/usr/bin/python3", "-I", "-c", "print(1)")
WORKER_INPUTS = ("a.py", "")
WORKER_INPUTS_HEX = "01c5ec2cca81fc53199d320d475353aa28cca3b6fe565ad2fa0db07135223438"


ROTATION_INPUT_HEX = (
    "636861727465722f6a6f75726e616c2d6b65792d726f746174696f6e2f7631000014636861727465722e"
    "6a6f75726e616c2f30303131000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d"
    "1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"
)


def test_key_rotation_signing_input_vector() -> None:
    old, new = bytes(range(32)), bytes(range(32, 64))
    got = framing.key_rotation_signing_input("charter.journal/0011", old, new)
    assert got == ref_key_rotation_signing_input("charter.journal/0011", old, new)
    assert got.hex() == ROTATION_INPUT_HEX


def test_entry_hash_vector() -> None:
    got = framing.entry_hash(PREV, 7, ORIGINATOR, 3, b"TestPing/v1", b'{"n":1}')
    assert got == ref_entry_hash(PREV, 7, ORIGINATOR, 3, b"TestPing/v1", b'{"n":1}')
    assert got.hex() == ENTRY_HEX
    assert len(got) == framing.HASH_SIZE


def test_entry_hash_vector_from_genesis() -> None:
    assert framing.GENESIS.hex() == "00" * 32
    got = framing.entry_hash(framing.GENESIS, 1, ORIGINATOR, 1, b"JournalCreated/v1", b"{}")
    assert got == ref_entry_hash(bytes(32), 1, ORIGINATOR, 1, b"JournalCreated/v1", b"{}")
    assert got.hex() == ENTRY_GENESIS_HEX


@pytest.mark.parametrize(
    "field",
    ["prev", "position", "originator", "version", "topic", "state", "topic/state boundary"],
)
def test_entry_hash_covers_every_field(field: str) -> None:
    """Each field, and the boundary between the variable-length ones, is in the hash."""
    base: dict[str, Any] = {
        "prev": PREV,
        "position": 7,
        "originator": ORIGINATOR,
        "version": 3,
        "topic": b"ab",
        "state": b"c",
    }
    changed = dict(base)
    match field:
        case "prev":
            changed["prev"] = bytes(31) + b"\x01"
        case "position":
            changed["position"] = 8
        case "originator":
            changed["originator"] = ORIGINATOR[:-1] + b"\x00"
        case "version":
            changed["version"] = 4
        case "topic":
            changed["topic"] = b"ax"
        case "state":
            changed["state"] = b"d"
        case _:  # same concatenated bytes, split differently: the length prefixes differ
            changed["topic"], changed["state"] = b"a", b"bc"
    assert framing.entry_hash(**changed) != framing.entry_hash(**base)
    assert framing.entry_hash(**changed) == ref_entry_hash(**changed)


def test_grant_signing_input_vector() -> None:
    got = framing.grant_signing_input(BODY)
    assert got == ref_grant_signing_input(BODY)
    assert got.hex() == SIGNING_INPUT_HEX


def test_grant_digest_vector() -> None:
    got = framing.grant_digest(BODY, SIGNATURE)
    assert got == ref_grant_digest(BODY, SIGNATURE)
    assert got.hex() == DIGEST_HEX
    # The body is length-prefixed: moving a byte from the body into the signature
    # (same concatenation) names a different grant.
    assert framing.grant_digest(BODY[:-1], BODY[-1:] + SIGNATURE) != got


def test_child_seed_vector() -> None:
    got = framing.child_seed(PARENT_SEED, "agent:estate/sa-1")
    assert got == ref_child_seed(PARENT_SEED, "agent:estate/sa-1")
    assert got.hex() == CHILD_SEED_HEX


def test_sandbox_key_signing_input_vector() -> None:
    got = framing.sandbox_key_signing_input(b"git/commit", b"hello\x00world")
    assert got == ref_sandbox_key_signing_input(b"git/commit", b"hello\x00world")
    assert got.hex() == SANDBOX_INPUT_HEX
    # Tag and message are each length-prefixed: a different split is different bytes.
    assert framing.sandbox_key_signing_input(b"git/commi", b"thello\x00world") != got


def test_worker_inputs_digest_vector() -> None:
    got = framing.worker_inputs_digest(WORKER_ARGV, WORKER_INPUTS)
    assert got == ref_worker_inputs_digest(WORKER_ARGV, WORKER_INPUTS)
    assert got.hex() == WORKER_INPUTS_HEX
    assert WorkerSpec(argv=WORKER_ARGV, inputs=WORKER_INPUTS).digest() == WORKER_INPUTS_HEX
    # argv and inputs are counted groups: moving an argument across names other bytes.
    assert framing.worker_inputs_digest((*WORKER_ARGV, "a.py"), ("",)) != got
    # Each argument is length-prefixed: the same characters split differently differ.
    assert framing.worker_inputs_digest(("/bin/echo", "ab"), ()) != framing.worker_inputs_digest(
        ("/bin/echo", "a", "b"), ()
    )


def test_child_key_derivation_through_authority() -> None:
    """derive_child_seed is the documented HMAC, and chains down the lineage."""
    child = derive_child_seed(PARENT_SEED, Lineage("agent:estate/sa-1"))
    grandchild = derive_child_seed(child, Lineage("agent:estate/sa-1/sa-2"))
    assert child == ref_child_seed(PARENT_SEED, "agent:estate/sa-1")
    assert grandchild == ref_child_seed(child, "agent:estate/sa-1/sa-2")
    assert child.hex() == CHILD_SEED_HEX
    assert grandchild.hex() == GRANDCHILD_SEED_HEX
    # The custody keys those seeds make (Ed25519 is deterministic).
    assert bytes(SigningKey(child).verify_key).hex() == CHILD_PUBLIC_HEX
    assert bytes(SigningKey(grandchild).verify_key).hex() == GRANDCHILD_PUBLIC_HEX
    # Control: a sibling gets another key.
    assert derive_child_seed(PARENT_SEED, Lineage("agent:estate/sa-2")) != child


def test_key_broker_signs_the_pinned_framing() -> None:
    """The broker's signature is over exactly the sandbox-key framing pinned above."""
    seed = bytes(range(32))
    with KeyBroker() as broker:
        handle = broker.issue(bytearray(seed))
        signature = broker.sign(handle, "git/commit", b"hello\x00world")
        public = broker.public_key(handle)
    key = SigningKey(seed)
    assert public == bytes(key.verify_key)
    assert framed("git/commit", b"hello\x00world").hex() == SANDBOX_INPUT_HEX
    assert signature == key.sign(bytes.fromhex(SANDBOX_INPUT_HEX)).signature
    assert verify_signature(public, "git/commit", b"hello\x00world", signature)
    assert not verify_signature(public, "git/commit", b"hello\x00world!", signature)


class FramingProbe(Event):
    """A test event for the stored-chain vector."""

    type_name = "TestFramingProbe"
    n: int


def test_a_real_journal_chains_with_the_documented_framing(journal_url: str) -> None:
    """Every stored entry's hash is the independent framing over its raw columns, the
    originator hashed as its 16 raw UUID bytes on both backends."""
    with Journal.create(journal_url) as journal:
        journal.append([FramingProbe(n=i) for i in range(3)])
        journal.append([FramingProbe(n=3)])
        rows = [row for batch in journal.batches() for row in batch]
        head = journal.head()
    assert len(rows) == 4
    prev = bytes(32)
    for position, oid, version, topic, state, link, stored in rows:
        originator = uuid.UUID(str(oid)).bytes
        assert bytes(link) == prev
        want = ref_entry_hash(prev, position, originator, version, topic.encode(), bytes(state))
        assert bytes(stored) == want, position
        prev = want
    assert head is not None
    assert head[1] == prev


# -- the tags themselves -----------------------------------------------------------------


def test_every_tag_has_a_vector_here() -> None:
    """A new domain added to framing must get a known-answer vector in this file."""
    found = {
        name: value
        for name, value in vars(framing).items()
        if name.endswith("_TAG") and isinstance(value, bytes)
    }
    assert found == TAGS


def test_tags_are_distinct_nul_terminated_and_prefix_free() -> None:
    tags = list(TAGS.values())
    assert len(set(tags)) == len(tags)
    for tag in tags:
        assert tag.endswith(b"\x00")
        assert b"\x00" not in tag[:-1]
        assert tag.startswith(b"charter/")
    for a, b in itertools.permutations(tags, 2):
        assert not b.startswith(a), (a, b)


# -- the budget vector's units -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB",
            (200_000, 600_000, 60_000, 536_870_912, 20_000_000),
        ),
        (
            "tokens=2M,wall=2h,cpu=1500ms,mem=8GiB,egress=1GB",
            (2_000_000, 7_200_000, 1_500, 8_589_934_592, 1_000_000_000),
        ),
        (
            " egress=3KB , mem=2KiB,cpu=2.01s,wall=1.5m,tokens=1.5K ",
            (1_500, 90_000, 2_010, 2_048, 3_000),
        ),
        ("tokens=7,wall=0ms,cpu=0s,mem=5B,egress=9", (7, 0, 0, 5, 9)),
    ],
)
def test_budget_units_parse_to_exact_integers(
    text: str, expected: tuple[int, int, int, int, int]
) -> None:
    budget = Budget.parse(text)
    got = (budget.tokens, budget.wall_ms, budget.cpu_ms, budget.mem_bytes, budget.egress_bytes)
    assert got == expected
    assert all(type(v) is int for v in got)


@pytest.mark.parametrize(
    "text",
    [
        "tokens=1m,wall=1s,cpu=1s,mem=1B,egress=0",  # m is minutes, not a token unit
        "tokens=1,wall=1s,cpu=1s,mem=1M,egress=0",  # M is not a byte unit (MB or MiB)
        "tokens=1,wall=1s,cpu=1s,mem=1mb,egress=0",  # units are case-sensitive
        "tokens=1,wall=1s,cpu=0.0001s,mem=1B,egress=0",  # not a whole millisecond
        "tokens=1,wall=1s,cpu=1s,mem=1B",  # an axis missing
        "tokens=1,tokens=2,wall=1s,cpu=1s,mem=1B,egress=0",  # an axis twice
        "tokens=1,wall=1s,cpu=1s,mem=1B,egress=0,gpu=1",  # an unknown axis
        "tokens=-1,wall=1s,cpu=1s,mem=1B,egress=0",  # negative
    ],
)
def test_budget_units_reject_what_they_do_not_define(text: str) -> None:
    with pytest.raises(BudgetSyntaxError):
        Budget.parse(text)


def test_key_rotation_signing_input_frames_an_origin_longer_than_32767_bytes() -> None:
    # The origin's length is an unsigned 16-bit count: 40000 bytes are framed, not refused.
    old, new = bytes(range(32)), bytes(range(32, 64))
    origin = "o" * 40_000
    got = framing.key_rotation_signing_input(origin, old, new)
    assert got == ref_key_rotation_signing_input(origin, old, new)
    tag_len = len(b"charter/journal-key-rotation/v1\x00")
    assert got[tag_len : tag_len + 2] == (40_000).to_bytes(2, "big")


def test_auditor_framings_follow_rfc6962_and_c2sp() -> None:
    # Re-implemented from the texts (RFC 6962 leaf/node hash; C2SP signed-note key id and
    # tlog-cosignature/v1 message); tests/audit/test_audit_framing.py pins their vectors.
    left, right, key = bytes(range(32)), bytes(range(32, 64)), bytes(range(200, 232))
    assert framing.merkle_leaf_hash(b"entry") == hashlib.sha256(b"\x00entry").digest()
    assert framing.merkle_node_hash(left, right) == hashlib.sha256(b"\x01" + left + right).digest()
    key_id = framing.note_key_id("example.com/log", b"\x01", key)
    assert key_id == hashlib.sha256(b"example.com/log\n\x01" + key).digest()[:4]
    assert len(key_id) == 4
    message = framing.cosignature_message(1679315147, b"o\n1\nAA==\n")
    assert message == b"cosignature/v1\ntime 1679315147\no\n1\nAA==\n"
