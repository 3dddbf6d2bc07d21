"""An independent, deliberately naive RFC 6962 implementation, written from the RFC's
text (§2.1 MTH, §2.1.1 PATH, §2.1.2 PROOF/SUBPROOF) and nothing else: recursion over
lists, no stored nodes, no bit tricks. The product code is checked against it."""

from __future__ import annotations

import hashlib
from functools import lru_cache


def h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def leaf(data: bytes) -> bytes:
    return h(b"\x00" + data)


def node(left: bytes, right: bytes) -> bytes:
    return h(b"\x01" + left + right)


def split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


class Naive:
    """MTH, PATH and PROOF over a fixed list of leaf hashes (MTH memoised by range)."""

    def __init__(self, leaves: list[bytes]) -> None:
        self.leaves = leaves
        self.mth = lru_cache(maxsize=None)(self._mth)

    def _mth(self, a: int, b: int) -> bytes:
        n = b - a
        if n == 0:
            return h(b"")
        if n == 1:
            return self.leaves[a]
        k = split(n)
        return node(self.mth(a, a + k), self.mth(a + k, b))

    def path(self, m: int, a: int, b: int) -> list[bytes]:
        n = b - a
        if n == 1:
            return []
        k = split(n)
        if m < k:
            return [*self.path(m, a, a + k), self.mth(a + k, b)]
        return [*self.path(m - k, a + k, b), self.mth(a, a + k)]

    def subproof(self, m: int, a: int, b: int, whole: bool) -> list[bytes]:
        n = b - a
        if m == n:
            return [] if whole else [self.mth(a, b)]
        k = split(n)
        if m <= k:
            return [*self.subproof(m, a, a + k, whole), self.mth(a + k, b)]
        return [*self.subproof(m - k, a + k, b, False), self.mth(a, a + k)]

    def proof(self, m: int, n: int) -> list[bytes]:
        return self.subproof(m, 0, n, True)


def root_from_path(m: int, n: int, leaf_hash: bytes, path: list[bytes]) -> bytes:
    """Recompute MTH(D[n]) from PATH(m, D[n]) by mirroring PATH's recursion."""
    if n == 1:
        if path:
            raise ValueError("path too long")
        return leaf_hash
    if not path:
        raise ValueError("path too short")
    k = split(n)
    if m < k:
        return node(root_from_path(m, k, leaf_hash, path[:-1]), path[-1])
    return node(path[-1], root_from_path(m - k, n - k, leaf_hash, path[:-1]))


def roots_from_proof(
    m: int, n: int, proof: list[bytes], old_root: bytes, whole: bool = True
) -> tuple[bytes, bytes]:
    """(MTH(D[m]) part, MTH(D[n])) recomputed from SUBPROOF(m, D[n], whole), mirroring
    its recursion; ``old_root`` stands for the subtree the proof leaves out (b = true)."""
    if m == n:
        if whole:
            if proof:
                raise ValueError("proof too long")
            return old_root, old_root
        if len(proof) != 1:
            raise ValueError("proof length")
        return proof[0], proof[0]
    if not proof:
        raise ValueError("proof too short")
    k = split(n)
    if m <= k:
        old, new = roots_from_proof(m, k, proof[:-1], old_root, whole)
        return old, node(new, proof[-1])
    old, new = roots_from_proof(m - k, n - k, proof[:-1], old_root, False)
    return node(proof[-1], old), node(proof[-1], new)


def verify_consistency(
    m: int, n: int, old_root: bytes, new_root: bytes, proof: list[bytes]
) -> bool:
    try:
        old, new = roots_from_proof(m, n, proof, old_root)
    except ValueError:
        return False
    return old == old_root and new == new_root
