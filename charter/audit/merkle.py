"""The RFC 6962 Merkle tree over the journal's entries: hashes, proofs, verification.

Pure (imports only core): an offline verifier uses it with neither eventsourcing nor a
database driver loaded.

Leaf ``i`` (0-based) is the ``i``-th entry in position order; its input is the entry's
frame (:func:`charter.core.framing.entry_frame`, the bytes whose sha256 is its chain
hash). Leaf hash ``sha256(0x00 ‖ input)``, node hash ``sha256(0x01 ‖ left ‖ right)``;
the tree of ``n`` leaves is RFC 6962 §2.1's ``MTH``.

Proofs are built from *perfect* subtree hashes only: ``node(level, index)`` is the root
of the ``2**level`` leaves starting at ``index * 2**level``. Every subtree the RFC's
``PATH`` and ``PROOF`` name is either such a node or the hash of O(log n) of them (the
right edge of the tree), so a proof needs O(log n) stored nodes.
:func:`inclusion_proof` and :func:`consistency_proof` follow RFC 6962 §2.1.1/§2.1.2;
:func:`verify_inclusion` and :func:`verify_consistency` are RFC 9162 §2.1.3.2/§2.1.4.2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from hashlib import sha256

from charter.audit.errors import ConsistencyProofError, InclusionProofError
from charter.core.errors import BadInputError
from charter.core.framing import HASH_SIZE, NODE_PREFIX, merkle_leaf_hash, merkle_node_hash

__all__ = [
    "EMPTY_ROOT",
    "CompactRange",
    "GapHasher",
    "decompose",
    "NodeKey",
    "append_leaves",
    "consistency_proof",
    "frontier_keys",
    "inclusion_proof",
    "from_mapping",
    "leaf_hash",
    "needed_nodes",
    "root_from_frontier",
    "root_from_leaves",
    "subtree_root",
    "tree_root",
    "verify_consistency",
    "verify_inclusion",
]

# MTH({}) = SHA-256() (RFC 6962 §2.1)
EMPTY_ROOT = sha256(b"").digest()

NodeKey = tuple[int, int]  # (level, index): the perfect subtree of 2**level leaves
NodeGetter = Callable[[int, int], bytes]


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_from_leaves(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH of the given leaf hashes, in O(n) time and O(log n) memory."""
    if not leaf_hashes:
        return EMPTY_ROOT
    frontier: list[tuple[int, bytes]] = []
    append_leaves(frontier, 0, leaf_hashes)
    return root_from_frontier(frontier)


def root_from_frontier(frontier: Sequence[tuple[int, bytes]]) -> bytes:
    """The root from the perfect subtrees of a tree's size (largest first)."""
    digest = frontier[-1][1]
    for _, left in reversed(frontier[:-1]):
        digest = merkle_node_hash(left, digest)
    return digest


def frontier_keys(size: int) -> list[NodeKey]:
    """The perfect subtrees a tree of ``size`` leaves decomposes into, largest first:
    what an appender needs to carry on (a set bit of ``size`` per subtree)."""
    keys = []
    start = 0
    for level in range(size.bit_length() - 1, -1, -1):
        if size >> level & 1:
            keys.append((level, start >> level))
            start += 1 << level
    return keys


def append_leaves(
    frontier: list[tuple[int, bytes]], size: int, leaf_hashes: Iterable[bytes]
) -> list[tuple[int, int, bytes]]:
    """Append leaves to a tree of ``size`` leaves whose perfect subtrees (level, hash),
    largest first, are ``frontier`` (changed in place). Returns every new node as
    ``(level, index, hash)``, leaves included: what a store keeps."""
    new: list[tuple[int, int, bytes]] = []
    for leaf in leaf_hashes:
        index, level, digest = size, 0, leaf
        new.append((0, index, digest))
        while frontier and frontier[-1][0] == level:
            _, left = frontier.pop()
            digest = merkle_node_hash(left, digest)
            level += 1
            index >>= 1
            new.append((level, index, digest))
        frontier.append((level, digest))
        size += 1
    return new


def subtree_root(
    node: NodeGetter, start: int, end: int, memo: dict[tuple[int, int], bytes] | None = None
) -> bytes:
    """MTH(D[start:end]) for a subtree of the RFC's decomposition (``start`` is a
    multiple of the largest power of two below ``end - start``), from perfect nodes.
    ``memo`` keeps the hashes of the (right-edge) subtrees that are not perfect, for a
    caller building many proofs of one tree."""
    n = end - start
    if n <= 0:
        raise BadInputError(f"empty subtree [{start}, {end})")
    if n & (n - 1) == 0 and start % n == 0:
        return node(n.bit_length() - 1, start // n)
    if memo is not None and (start, end) in memo:
        return memo[(start, end)]
    k = _split(n)
    digest = merkle_node_hash(
        subtree_root(node, start, start + k, memo), subtree_root(node, start + k, end, memo)
    )
    if memo is not None:
        memo[(start, end)] = digest
    return digest


def tree_root(node: NodeGetter, size: int) -> bytes:
    """MTH of the first ``size`` leaves."""
    return EMPTY_ROOT if size == 0 else subtree_root(node, 0, size)


def inclusion_proof(
    node: NodeGetter, index: int, size: int, memo: dict[tuple[int, int], bytes] | None = None
) -> tuple[bytes, ...]:
    """RFC 6962 §2.1.1 PATH(index, D[size]), leaf-side first."""
    if not 0 <= index < size:
        raise BadInputError(f"leaf {index} is not in a tree of {size} leaves")
    path: list[bytes] = []
    start, end, m = 0, size, index
    # PATH recurses into the half holding m and appends the other half's root after
    # the sub-path: walk down, collecting siblings, then reverse.
    while end - start > 1:
        k = _split(end - start)
        if m < k:
            path.append(subtree_root(node, start + k, end, memo))
            end = start + k
        else:
            path.append(subtree_root(node, start, start + k, memo))
            start, m = start + k, m - k
    return tuple(reversed(path))


def consistency_proof(node: NodeGetter, old: int, new: int) -> tuple[bytes, ...]:
    """RFC 6962 §2.1.2 PROOF(old, D[new]); empty when ``old`` is 0 or equals ``new``."""
    if not 0 <= old <= new:
        raise BadInputError(f"no consistency proof from size {old} to size {new}")
    if old in (0, new):
        return ()
    proof: list[bytes] = []
    start, end, m, whole = 0, new, old, True
    while True:
        n = end - start
        if m == n:
            if not whole:
                proof.append(subtree_root(node, start, end))
            break
        k = _split(n)
        if m <= k:
            proof.append(subtree_root(node, start + k, end))
            end = start + k
        else:
            proof.append(subtree_root(node, start, start + k))
            start, m, whole = start + k, m - k, False
    return tuple(reversed(proof))


def needed_nodes(build: Callable[[NodeGetter], object]) -> list[NodeKey]:
    """The perfect nodes a proof or root reads, in order, found by building it once
    over placeholder hashes (which nodes are read depends only on the sizes): a store
    fetches them all in one query, then builds again."""
    keys: list[NodeKey] = []

    def record(level: int, index: int) -> bytes:
        keys.append((level, index))
        return bytes(HASH_SIZE)

    build(record)
    return keys


def from_mapping(nodes: Mapping[NodeKey, bytes]) -> NodeGetter:
    """A node getter over fetched nodes."""
    return lambda level, index: nodes[(level, index)]


# -- verification (RFC 9162) ----------------------------------------------------------


def _check_hashes(what: str, hashes: Iterable[bytes], error: type[Exception]) -> None:
    for h in hashes:
        if len(h) != HASH_SIZE:
            raise error(f"{what}: a hash of {len(h)} bytes, not {HASH_SIZE}")


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """RFC 9162 §2.1.3.2: raise :class:`InclusionProofError` unless ``proof`` shows the
    leaf hash ``leaf`` at ``index`` in the tree of ``size`` leaves with ``root``."""
    _check_hashes("inclusion proof", (leaf, root, *proof), InclusionProofError)
    if not 0 <= index < size:
        raise InclusionProofError(f"leaf index {index} is not below the tree size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise InclusionProofError("the inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = merkle_node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = merkle_node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise InclusionProofError("the inclusion proof is shorter than the tree is deep")
    if r != root:
        raise InclusionProofError(
            f"leaf {index} does not lead to the root of the tree of {size} leaves "
            "(the entry, the proof or the root was changed)"
        )


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """RFC 9162 §2.1.4.2: raise :class:`ConsistencyProofError` unless ``proof`` shows
    the tree of ``new_size`` leaves (``new_root``) extends the one of ``old_size``."""
    _check_hashes("consistency proof", (old_root, new_root, *proof), ConsistencyProofError)
    if _trivially_consistent(old_size, new_size, old_root, new_root, proof):
        return
    if not proof:
        raise ConsistencyProofError("an empty consistency proof between different sizes")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ConsistencyProofError("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = merkle_node_hash(c, fr)
            sr = merkle_node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = merkle_node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ConsistencyProofError("the consistency proof is too short")
    if fr != old_root or sr != new_root:
        raise ConsistencyProofError(
            f"the tree of {new_size} leaves is not an extension of the tree of {old_size} "
            "leaves (a fork, a rewritten history, or a changed proof)"
        )


def _trivially_consistent(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """The cases RFC 9162 leaves out: a rollback, the same size, the empty tree."""
    if not 0 <= old_size <= new_size:
        raise ConsistencyProofError(
            f"tree size {new_size} is smaller than {old_size}: the log was rolled back"
        )
    if old_size == new_size:
        if proof or old_root != new_root:
            raise ConsistencyProofError(
                f"two different roots for the same tree size {old_size}: a fork"
            )
        return True
    if old_size == 0:
        if proof or old_root != EMPTY_ROOT:
            raise ConsistencyProofError("the empty tree has another root than sha256('')")
        return True
    return False


def leaf_hash(leaf_input: bytes) -> bytes:
    """The leaf hash of one entry frame (RFC 6962 ``sha256(0x00 ‖ input)``)."""
    return merkle_leaf_hash(leaf_input)


def decompose(start: int, end: int) -> list[NodeKey]:
    """The leaves ``[start, end)`` as the fewest perfect subtrees, left to right: from
    ``s = start``, the largest ``2**level`` with ``s`` a multiple of it and
    ``s + 2**level <= end`` (the compact range of RFC 9162 §2.1.5's verifiers)."""
    out: list[NodeKey] = []
    s = start
    while s < end:
        level = (s & -s).bit_length() - 1 if s else (end - s).bit_length() - 1
        while s + (1 << level) > end:
            level -= 1
        out.append((level, s >> level))
        s += 1 << level
    return out


class CompactRange:
    """The tree of the leaves ``[0, size)`` as its O(log n) perfect subtrees (one per
    bit of ``size``), grown left to right one leaf or one aligned subtree at a time:
    what a streaming verifier keeps to rebuild the root of a whole tree."""

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[tuple[int, bytes]] = []  # (level, hash), levels decreasing

    def push(self, level: int, digest: bytes) -> None:
        """Append the perfect subtree of ``2**level`` leaves starting at ``size``
        (``size`` must be a multiple of ``2**level``)."""
        size = self.size
        if size & ((1 << level) - 1):
            raise BadInputError(f"a subtree of 2**{level} leaves cannot start at {size}")
        stack = self._stack
        self.size = size + (1 << level)
        # the trailing one bits of size >> level are the subtrees it completes
        carry = (size >> level) ^ ((size >> level) + 1)
        while carry > 1:
            digest = merkle_node_hash(stack.pop()[1], digest)
            level += 1
            carry >>= 1
        stack.append((level, digest))

    def push_leaves(self, hashes: Sequence[bytes]) -> None:
        """Append these leaf hashes, in order: the same tree as pushing each at level 0,
        a batch's perfect subtrees reduced a level at a time (the verifier's and the
        exporter's hot path: no call per leaf)."""
        i, node = 0, NODE_PREFIX
        for level, _ in decompose(self.size, self.size + len(hashes)):
            nodes = hashes[i : i + (1 << level)]
            i += 1 << level
            for _ in range(level):
                pairs = zip(nodes[::2], nodes[1::2], strict=True)
                nodes = [sha256(node + a + b).digest() for a, b in pairs]
            self.push(level, nodes[0])

    def root(self) -> bytes:
        """MTH of the leaves pushed so far."""
        if not self._stack:
            return EMPTY_ROOT
        digest = self._stack[-1][1]
        for _, left in reversed(self._stack[:-1]):
            digest = merkle_node_hash(left, digest)
        return digest


class GapHasher:
    """The perfect subtrees of a run of leaves ``[start, …)`` pushed one at a time:
    siblings are merged as soon as both are in, so at the run's end it holds exactly
    :func:`decompose`'s subtrees of the run (what a bundle gives for leaves it omits)."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.end = start
        self._stack: list[tuple[int, int, bytes]] = []  # (level, index, hash)

    def push(self, leaf_hash: bytes) -> None:
        stack = self._stack
        stack.append((0, self.end, leaf_hash))
        self.end += 1
        while len(stack) > 1:
            level, index, right = stack[-1]
            left_level, left_index, left = stack[-2]
            if left_level != level or left_index % 2 or left_index + 1 != index:
                break
            del stack[-2:]
            stack.append((level + 1, index >> 1, merkle_node_hash(left, right)))

    def hashes(self) -> list[bytes]:
        return [digest for _, _, digest in self._stack]
