"""The RFC 6962 tree, its proofs and their RFC 9162 verification (charter.audit.merkle),
checked against the naive implementation in tests/audit/rfc6962.py and against pymerkle
(a third-party RFC 6962 tree): its roots for every size, and its verifier for every
inclusion proof. pymerkle's consistency proofs are laid out differently from RFC 6962's
PROOF, so consistency proofs are checked by the naive RFC verifier."""

from __future__ import annotations

import random

import pytest
from pymerkle import InclusionProof, InmemoryTree, InvalidProof
from pymerkle import verify_inclusion as pymerkle_verify_inclusion
from pymerkle.core import _inclusion_path_layout

from charter.audit import merkle
from charter.audit.errors import ConsistencyProofError, InclusionProofError
from charter.core.errors import BadInputError
from tests.audit import rfc6962

N = 300


def _data(i: int) -> bytes:
    return b"entry-%d" % i


@pytest.fixture(scope="module")
def small() -> tuple[list[bytes], dict[merkle.NodeKey, bytes], rfc6962.Naive]:
    leaves = [rfc6962.leaf(_data(i)) for i in range(N)]
    nodes = {(lv, ix): hh for lv, ix, hh in merkle.append_leaves([], 0, leaves)}
    return leaves, nodes, rfc6962.Naive(leaves)


def test_leaf_and_node_hashes_use_the_rfc_prefixes() -> None:
    assert merkle.leaf_hash(b"abc") == rfc6962.h(b"\x00abc")
    left, right = rfc6962.h(b"l"), rfc6962.h(b"r")
    assert merkle.root_from_leaves([left, right]) == rfc6962.h(b"\x01" + left + right)
    assert merkle.root_from_leaves([]) == rfc6962.h(b"")


def test_roots_match_pymerkle_and_the_naive_mth_for_every_size(small: tuple) -> None:
    leaves, nodes, naive = small
    tree = InmemoryTree(algorithm="sha256")  # RFC 6962 prefixes (its default security)
    get = merkle.from_mapping(nodes)
    for n in range(1, N + 1):
        tree.append_entry(_data(n - 1))
        expected = tree.get_root(n)
        assert merkle.tree_root(get, n) == expected
        assert merkle.root_from_leaves(leaves[:n]) == expected
        assert naive.mth(0, n) == expected


def test_pymerkle_refuses_a_changed_path_it_is_given(small: tuple) -> None:
    """Positive control for the check above: pymerkle does verify what it is given."""
    leaves, nodes, naive = small
    proof = list(merkle.inclusion_proof(merkle.from_mapping(nodes), 5, 100))
    rule, _ = _inclusion_path_layout(6, 100)
    proof[2] = bytes(32)
    theirs = InclusionProof("sha256", True, 100, 6, rule, [leaves[5], *proof])
    with pytest.raises(InvalidProof):
        pymerkle_verify_inclusion(leaves[5], naive.mth(0, 100), theirs)


def test_inclusion_proofs_for_every_size_and_index(small: tuple) -> None:
    leaves, nodes, naive = small
    get = merkle.from_mapping(nodes)
    for n in range(1, N + 1):
        root = naive.mth(0, n)
        for m in range(n):
            proof = merkle.inclusion_proof(get, m, n)
            assert list(proof) == naive.path(m, 0, n)
            merkle.verify_inclusion(leaves[m], m, n, proof, root)
            assert rfc6962.root_from_path(m, n, leaves[m], list(proof)) == root
            # pymerkle's own verifier: its proof is the leaf then the same audit path,
            # with the left/right rule it derives from the index and size itself
            rule, _ = _inclusion_path_layout(m + 1, n)
            theirs = InclusionProof("sha256", True, n, m + 1, rule, [leaves[m], *proof])
            pymerkle_verify_inclusion(leaves[m], root, theirs)


def test_consistency_proofs_for_every_pair_of_sizes(small: tuple) -> None:
    _, nodes, naive = small
    get = merkle.from_mapping(nodes)
    for n in range(1, N + 1):
        new_root = naive.mth(0, n)
        for m in range(1, n + 1):
            proof = merkle.consistency_proof(get, m, n)
            expected = naive.proof(m, n) if m < n else []
            assert list(proof) == expected
            merkle.verify_consistency(m, n, naive.mth(0, m), new_root, proof)
            assert rfc6962.verify_consistency(m, n, naive.mth(0, m), new_root, list(proof))


def test_random_proofs_up_to_a_million_leaves() -> None:
    rng = random.Random(6962)
    size = 1_000_000 + rng.randrange(1000)
    leaves = [rfc6962.leaf(i.to_bytes(4, "big")) for i in range(size)]
    frontier: list[tuple[int, bytes]] = []
    nodes = {(lv, ix): hh for lv, ix, hh in merkle.append_leaves(frontier, 0, leaves)}
    get = merkle.from_mapping(nodes)
    root = merkle.tree_root(get, size)
    assert root == merkle.root_from_leaves(leaves)
    for _ in range(200):
        n = rng.randrange(1, size + 1)
        m = rng.randrange(n)
        root_n = merkle.tree_root(get, n)
        proof = merkle.inclusion_proof(get, m, n)
        merkle.verify_inclusion(leaves[m], m, n, proof, root_n)
        assert rfc6962.root_from_path(m, n, leaves[m], list(proof)) == root_n
        rule, _ = _inclusion_path_layout(m + 1, n)
        theirs = InclusionProof("sha256", True, n, m + 1, rule, [leaves[m], *proof])
        pymerkle_verify_inclusion(leaves[m], root_n, theirs)
        old = rng.randrange(1, n + 1)
        old_root = merkle.tree_root(get, old)
        cproof = merkle.consistency_proof(get, old, n)
        merkle.verify_consistency(old, n, old_root, root_n, cproof)
        assert rfc6962.verify_consistency(old, n, old_root, root_n, list(cproof))
    # the appender's frontier is the tree's decomposition into perfect subtrees
    assert [lv for lv, _ in frontier] == [lv for lv, _ in merkle.frontier_keys(size)]


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def test_a_flipped_byte_in_an_inclusion_proof_leaf_or_root_is_refused(small: tuple) -> None:
    leaves, nodes, naive = small
    get = merkle.from_mapping(nodes)
    n, m = 213, 77
    root = naive.mth(0, n)
    proof = merkle.inclusion_proof(get, m, n)
    merkle.verify_inclusion(leaves[m], m, n, proof, root)  # positive control
    for i in range(len(proof)):
        for at in (0, 17, 31):
            bad = (*proof[:i], _flip(proof[i], at), *proof[i + 1 :])
            with pytest.raises(InclusionProofError):
                merkle.verify_inclusion(leaves[m], m, n, bad, root)
            assert not _naive_includes(m, n, leaves[m], bad, root)
    for at in range(32):
        with pytest.raises(InclusionProofError):
            merkle.verify_inclusion(leaves[m], m, n, proof, _flip(root, at))
        with pytest.raises(InclusionProofError):
            merkle.verify_inclusion(_flip(leaves[m], at), m, n, proof, root)
    for bad_shape in (proof[:-1], (*proof, proof[0])):
        with pytest.raises(InclusionProofError):
            merkle.verify_inclusion(leaves[m], m, n, bad_shape, root)
    with pytest.raises(InclusionProofError):  # the right leaf at another index
        merkle.verify_inclusion(leaves[m], m + 1, n, proof, root)
    with pytest.raises(InclusionProofError):
        merkle.verify_inclusion(leaves[m], n, n, proof, root)
    with pytest.raises(InclusionProofError):
        merkle.verify_inclusion(leaves[m], m, n, (*proof[:-1], proof[-1][:31]), root)


def _naive_includes(m: int, n: int, leaf: bytes, proof: tuple, root: bytes) -> bool:
    try:
        return rfc6962.root_from_path(m, n, leaf, list(proof)) == root
    except ValueError:
        return False


def test_a_flipped_byte_in_a_consistency_proof_or_root_is_refused(small: tuple) -> None:
    _, nodes, naive = small
    get = merkle.from_mapping(nodes)
    for m, n in ((7, 300), (64, 129), (1, 2), (255, 256)):
        old, new = naive.mth(0, m), naive.mth(0, n)
        proof = merkle.consistency_proof(get, m, n)
        merkle.verify_consistency(m, n, old, new, proof)  # positive control
        for i in range(len(proof)):
            bad = (*proof[:i], _flip(proof[i], i % 32), *proof[i + 1 :])
            with pytest.raises(ConsistencyProofError):
                merkle.verify_consistency(m, n, old, new, bad)
            assert not rfc6962.verify_consistency(m, n, old, new, list(bad))
        for at in (0, 31):
            with pytest.raises(ConsistencyProofError):
                merkle.verify_consistency(m, n, _flip(old, at), new, proof)
            with pytest.raises(ConsistencyProofError):
                merkle.verify_consistency(m, n, old, _flip(new, at), proof)
        for bad_shape in (proof[:-1], (*proof, proof[0]), ()):
            with pytest.raises(ConsistencyProofError):
                merkle.verify_consistency(m, n, old, new, bad_shape)


def test_rollback_and_same_size_fork_are_refused(small: tuple) -> None:
    _, _, naive = small
    with pytest.raises(ConsistencyProofError, match="rolled back"):
        merkle.verify_consistency(10, 9, naive.mth(0, 10), naive.mth(0, 9), ())
    with pytest.raises(ConsistencyProofError, match="fork"):
        merkle.verify_consistency(10, 10, naive.mth(0, 10), naive.mth(0, 9), ())
    merkle.verify_consistency(10, 10, naive.mth(0, 10), naive.mth(0, 10), ())
    merkle.verify_consistency(0, 10, merkle.EMPTY_ROOT, naive.mth(0, 10), ())
    with pytest.raises(ConsistencyProofError):
        merkle.verify_consistency(0, 10, naive.mth(0, 1), naive.mth(0, 10), ())


def test_proofs_for_leaves_or_sizes_outside_the_tree_are_bad_input(small: tuple) -> None:
    get = merkle.from_mapping(small[1])
    with pytest.raises(BadInputError):
        merkle.inclusion_proof(get, 5, 5)
    with pytest.raises(BadInputError):
        merkle.consistency_proof(get, 6, 5)


def test_a_proof_reads_only_logarithmically_many_stored_nodes() -> None:
    size = 1_000_000
    keys = merkle.needed_nodes(lambda get: merkle.inclusion_proof(get, 123_456, size))
    assert len(keys) <= 2 * size.bit_length()
    keys = merkle.needed_nodes(lambda get: merkle.consistency_proof(get, 654_321, size))
    assert len(keys) <= 2 * size.bit_length()
    keys = merkle.needed_nodes(lambda get: merkle.tree_root(get, size))
    assert keys == merkle.frontier_keys(size)


@pytest.mark.parametrize("seed", range(8))
def test_pushing_leaves_a_batch_at_a_time_builds_the_reference_tree(seed: int) -> None:
    """``push_leaves`` (the exporter's and the verifier's batches, cut anywhere) gives
    the root of RFC 6962's recursive definition, as pushing leaf by leaf does."""
    rng = random.Random(seed)
    leaves = [rng.randbytes(rng.randrange(1, 40)) for _ in range(rng.randrange(1, 700))]
    hashes = [rfc6962.leaf(x) for x in leaves]
    batched, one_by_one = merkle.CompactRange(), merkle.CompactRange()
    i = 0
    while i < len(hashes):
        n = rng.choice([0, 1, 2, 3, 7, 64, 255, 256, 300])
        batched.push_leaves(hashes[i : i + n])
        i += n
    for digest in hashes:
        one_by_one.push(0, digest)
    expected = rfc6962.Naive(hashes).mth(0, len(hashes))
    assert batched.size == one_by_one.size == len(leaves)
    assert batched.root() == one_by_one.root() == expected
