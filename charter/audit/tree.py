"""The journal's Merkle tree, kept by a tracked follower, and what is read from it.

:class:`MerkleLog` follows the journal like the projector does (not in the append path):
each step reads the entries after its tracked position, checks that they chain, hashes
each entry's frame into a leaf, and commits the new leaves, the new perfect-subtree nodes
and the tracking position in one transaction. Proofs are then built from O(log n)
stored nodes. :func:`verify_extension` proves that the journal as it stands now extends
a checkpoint saved earlier, recomputing every leaf from the stored bytes (it trusts
neither the stored tree nor the chain columns).

Why this follower is not a ``JournalFold`` (``charter/ledger/_follow.py``): that base
reads the three columns a read model needs and decodes the events of chosen types into
an in-process fold; the tree needs all seven stored columns of every entry, raw (its
leaf is the entry's frame, re-chained as it is read: an event decoded and re-encoded is
not the stored bytes), and commits its leaves, nodes and tracked position together in
the tree's own tables (``_tree_store.py``), surviving a SIGKILL mid-step. The two share
the journal's batch reads (``Journal.batches`` / ``Journal.payloads``), not a fold.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from hashlib import sha256
from typing import Any

from nacl.signing import SigningKey

from charter.audit import merkle
from charter.audit._tree_store import TreeStore
from charter.audit.errors import (
    ConsistencyProofError,
    KeyRotationError,
    NotInTreeError,
    TreeAheadError,
    TreeFollowError,
)
from charter.audit.keys import ROTATION_TOPIC, KeyHistory, journal_origin
from charter.audit.note import Checkpoint, NoteKey, SignedNote, sign_checkpoint, verify_checkpoint
from charter.audit.proofs import InclusionText
from charter.core.clock import now_ms
from charter.core.errors import InternalError, StateError
from charter.core.framing import GENESIS, NOTE_ED25519, entry_frame, merkle_leaf_hash
from charter.ledger import JournalReader, open_reader, resolve_location

__all__ = [
    "ConsistencyProof",
    "ExtensionReport",
    "InclusionProof",
    "MerkleLog",
    "anchor_key",
    "key_history",
    "leaf_hashes",
    "JournalReader",
    "ledger_journal",
    "verify_extension",
]

_CHUNK = 20_000
Signers = SigningKey | Sequence[SigningKey]  # the journal's keys (rotated ones too)


@dataclass(frozen=True)
class InclusionProof:
    """An entry's leaf in a tree of ``size`` leaves, and its RFC 6962 audit path."""

    position: int
    leaf: int
    size: int
    leaf_hash: bytes
    root: bytes
    path: tuple[bytes, ...]

    def verify(self) -> None:
        merkle.verify_inclusion(self.leaf_hash, self.leaf, self.size, self.path, self.root)

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "index": self.leaf,
            "size": self.size,
            "leaf_hash": self.leaf_hash.hex(),
            "root": self.root.hex(),
            "path": [p.hex() for p in self.path],
        }


@dataclass(frozen=True)
class ConsistencyProof:
    """RFC 6962 consistency proof between two sizes of the tree."""

    old: int
    new: int
    old_root: bytes
    new_root: bytes
    path: tuple[bytes, ...]

    def verify(self) -> None:
        merkle.verify_consistency(self.old, self.new, self.old_root, self.new_root, self.path)

    def to_json(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "old_root": self.old_root.hex(),
            "new_root": self.new_root.hex(),
            "path": [p.hex() for p in self.path],
        }


def leaf_hashes(
    journal: JournalReader, start: int | None = None, stop: int | None = None
) -> Iterator[tuple[int, bytes, str, bytes]]:
    """``(position, leaf hash, topic, state)`` of every entry in range, recomputed from
    the stored bytes; raises :class:`TreeFollowError` where an entry's bytes or link do
    not chain."""
    before = journal.predecessor(start) if start else None
    prev = before.chain_hash if before else GENESIS
    conv = journal.originator_bytes
    for batch in journal.batches(start, stop):
        for position, oid, version, topic, state, link, chain in batch:
            frame = entry_frame(prev, position, conv(oid), version, topic.encode(), bytes(state))
            if bytes(link) != prev or sha256(frame).digest() != bytes(chain):
                raise TreeFollowError(
                    f"entry {position} does not chain (its bytes or its link were changed); "
                    "no tree is built over it: run `charter journal verify`"
                )
            prev = bytes(chain)
            yield position, merkle_leaf_hash(frame), topic, bytes(state)


def _path_of(get: merkle.NodeGetter, *, leaf: int, size: int) -> tuple[bytes, ...]:
    return merkle.inclusion_proof(get, leaf, size)


def _rotate(history: KeyHistory, leaf: int, state: bytes) -> KeyHistory:
    """The history after a rotation entry; unchanged if the rotation is not valid (it
    then signs nothing, and ``charter audit`` reports it)."""
    try:
        return history.rotated(leaf, json.loads(state)["payload"])
    except (KeyRotationError, ValueError, KeyError, TypeError):
        return history


def ledger_journal(db: str | None, *, read_only: bool = False) -> JournalReader | None:
    """The journal at ``db`` (``--db``, ``CHARTER_DB`` or the home's, by the ledger's
    location resolution) opened by the ledger alone, as charter.app opens it, when that
    needs none of the app's settings (they are PostgreSQL's write timeouts): only to
    read, or a SQLite file (its reader keeps the tree's tables in the file). None
    otherwise: the caller opens it through charter.app. The auditor's commands load
    neither the app, nor eventsourcing, nor a driver the journal does not use."""
    location = resolve_location(db)
    if not read_only and location.kind != "sqlite":
        return None
    return open_reader(location, read_only=read_only)


def anchor_key(journal: JournalReader) -> NoteKey:
    """The journal's first verifier key, from its metadata alone (no tree, no write: it
    works on a read-only copy)."""
    key = journal.meta.journal_key
    return NoteKey.make(journal_origin(key), NOTE_ED25519, bytes.fromhex(key))


def key_history(journal: JournalReader) -> tuple[KeyHistory, int, list[dict[str, Any]]]:
    """The journal key's history, the journal's size and the valid rotations (``{"leaf",
    "rotation"}``, the key-history document's), read from its entries alone (every
    entry re-hashed, every rotation checked; no tree, no write)."""
    key = journal.meta.journal_key
    history = KeyHistory.start(journal_origin(key), bytes.fromhex(key))
    rotations: list[dict[str, Any]] = []
    size = 0
    for _, _, topic, state in leaf_hashes(journal):
        if topic.startswith(ROTATION_TOPIC):
            history = _rotate(history, size, state)
            if history.keys[-1][0] == size:
                rotations.append({"leaf": size, "rotation": json.loads(state)["payload"]})
        size += 1
    return history, size, rotations


class MerkleLog:
    """The Merkle tree of one open journal: follow, prove, checkpoint."""

    def __init__(self, journal: JournalReader) -> None:
        self.journal = journal
        self.store = TreeStore(journal)
        self.origin = journal_origin(journal.meta.journal_key)
        self.initial = bytes.fromhex(journal.meta.journal_key)
        # (size, frontier) as of the last commit of this process, if still current
        self._frontier: tuple[int, list[tuple[int, bytes]]] | None = None

    # -- following -------------------------------------------------------------------

    def catch_up(self, stop: int | None = None, *, chunk: int = _CHUNK) -> int:
        """Add every entry after the tracked position (up to ``stop``) to the tree, a
        chunk per transaction; return the tree size."""
        head = self.journal.head()
        target = 0 if head is None else head[0]
        if stop is not None:
            target = min(target, stop)
        while True:
            with self.store.write() as cur:
                tracked = self.store.tracked(cur)
                size = self.store.size(cur)
                if tracked >= target:
                    return size
                frontier = self._load_frontier(cur, size)
                self._frontier = None  # until this transaction commits
                end = min(target, tracked + chunk)
                added = list(leaf_hashes(self.journal, tracked + 1, end))
                leaves = [(size + i, row[0]) for i, row in enumerate(added)]
                nodes = merkle.append_leaves(frontier, size, (row[1] for row in added))
                self.store.add(cur, leaves, nodes, end)
                history = self._history(cur)
                for i, (_, _, topic, state) in enumerate(added):
                    if topic.startswith(ROTATION_TOPIC):
                        history = _rotate(history, size + i, state)
                        if history.keys[-1][0] == size + i:
                            self.store.add_rotation(cur, size + i, history.current)
            self._frontier = (size + len(added), frontier)

    def _load_frontier(self, cur: Any, size: int) -> list[tuple[int, bytes]]:
        if self._frontier is not None and self._frontier[0] == size:
            return self._frontier[1]
        keys = merkle.frontier_keys(size)
        found = self.store.nodes(cur, keys)
        if len(found) != len(keys):
            raise InternalError(f"the Merkle tree of {size} leaves is missing stored nodes")
        return [(level, found[(level, index)]) for level, index in keys]

    def follow(
        self,
        key: Signers | None = None,
        *,
        poll_s: float = 0.1,
        publish_every_s: float = 1.0,
        until: Callable[[], bool] = lambda: False,
    ) -> int:
        """Catch up, then keep following until ``until()``; with ``key``, publish a
        checkpoint whenever the tree grew and ``publish_every_s`` has passed since the
        last one (so a commit is covered by a checkpoint within that bound). ``poll_s``
        batches: the follower sleeps ``poll_s`` after every look at the head, caught up
        or not, so the commits of that time go into one tree transaction and it takes the
        journal's write lock (SQLite) at most once a ``poll_s``, not once per commit
        (catching up as soon as the head moved would, under a stream of commits)."""
        size = self.catch_up()
        published = -1
        last = 0.0
        while True:
            if key is not None and size != published and time.monotonic() - last >= publish_every_s:
                self.publish(self.checkpoint(key))
                published, last = size, time.monotonic()
            if until():
                return size
            head = self.journal.head()
            if head is not None and head[0] > self.tracked():
                size = self.catch_up()
            time.sleep(poll_s)

    # -- reading ---------------------------------------------------------------------

    def tracked(self) -> int:
        with self.store.read() as cur:
            return self.store.tracked(cur)

    def size(self) -> int:
        with self.store.read() as cur:
            return self.store.size(cur)

    def _build(self, cur: Any, build: Callable[[merkle.NodeGetter], Any]) -> Any:
        keys = merkle.needed_nodes(build)
        nodes = self.store.nodes(cur, keys)
        if len(nodes) != len(set(keys)):
            raise InternalError("the Merkle tree is missing stored nodes it should have")
        return build(merkle.from_mapping(nodes))

    def _size_or_current(self, cur: Any, size: int | None) -> int:
        current = self.store.size(cur)
        if size is None:
            return current
        if not 0 <= size <= current:
            raise NotInTreeError(
                f"tree size {size} is past the tree's {current} leaves (run `charter "
                "checkpoint` to bring the tree up to the journal's head)"
            )
        return size

    def root(self, size: int | None = None) -> tuple[int, bytes]:
        with self.store.read() as cur:
            n = self._size_or_current(cur, size)
            return n, self._build(cur, lambda get: merkle.tree_root(get, n))

    def inclusion(self, position: int, size: int | None = None) -> InclusionProof:
        """The inclusion proof of the entry at ``position`` in the tree of ``size``
        leaves (default: the whole tree as followed)."""
        with self.store.read() as cur:
            n = self._size_or_current(cur, size)
            leaf = self.store.leaf_of(cur, position)
            if leaf is None or leaf >= n:
                raise NotInTreeError(
                    f"position {position} is not an entry of the tree of {n} leaves"
                )
            path = self._build(cur, lambda get: merkle.inclusion_proof(get, leaf, n))
            leaf_hash = self.store.nodes(cur, [(0, leaf)])[(0, leaf)]
            root = self._build(cur, lambda get: merkle.tree_root(get, n))
        return InclusionProof(
            position=position, leaf=leaf, size=n, leaf_hash=leaf_hash, root=root, path=path
        )

    def inclusions(self, positions: list[int], size: int) -> list[InclusionProof]:
        """Inclusion proofs of many entries in the tree of ``size`` leaves, from one read
        snapshot, fetching each stored node once."""
        with self.store.read() as cur:
            n = self._size_or_current(cur, size)
            leaves = self.store.leaves_of(cur, positions)
            missing = [p for p in positions if p not in leaves or leaves[p] >= n]
            if missing:
                raise NotInTreeError(f"position {missing[0]} is not in the tree of {n} leaves")
            if len(positions) * 8 >= n:  # most of the tree: read every node at once
                get = merkle.from_mapping(self.store.all_nodes(cur))
            else:
                builds = [functools.partial(_path_of, leaf=leaves[p], size=n) for p in positions]
                keys = {k for build in builds for k in merkle.needed_nodes(build)}
                keys |= set(merkle.frontier_keys(n)) | {(0, leaves[p]) for p in positions}
                get = merkle.from_mapping(self.store.nodes(cur, keys))
        memo: dict[tuple[int, int], bytes] = {}
        root = merkle.tree_root(get, n)
        return [
            InclusionProof(
                position=p,
                leaf=leaves[p],
                size=n,
                leaf_hash=get(0, leaves[p]),
                root=root,
                path=merkle.inclusion_proof(get, leaves[p], n, memo),
            )
            for p in positions
        ]

    def consistency(self, old: int, new: int | None = None) -> ConsistencyProof:
        with self.store.read() as cur:
            n = self._size_or_current(cur, new)
            if not 0 <= old <= n:
                raise NotInTreeError(f"no consistency proof from size {old} to size {n}")
            path = self._build(cur, lambda get: merkle.consistency_proof(get, old, n))
            old_root = self._build(cur, lambda get: merkle.tree_root(get, old))
            new_root = self._build(cur, lambda get: merkle.tree_root(get, n))
        return ConsistencyProof(old=old, new=n, old_root=old_root, new_root=new_root, path=path)

    def position_of_leaf(self, leaf: int) -> int | None:
        with self.store.read() as cur:
            return self.store.position_of(cur, leaf)

    # -- checkpoints -----------------------------------------------------------------

    def anchor_key(self) -> NoteKey:
        """The journal's first verifier key (from its metadata): the trust anchor its
        key history starts from."""
        return NoteKey.make(self.origin, NOTE_ED25519, self.initial)

    def _history(self, cur: Any) -> KeyHistory:
        history = KeyHistory.start(self.origin, self.initial)
        return replace(history, keys=(*history.keys, *self.store.rotations(cur)))

    def history(self) -> KeyHistory:
        """The journal key's history, as the follower verified it."""
        with self.store.read() as cur:
            return self._history(cur)

    def note_key(self, size: int | None = None) -> NoteKey:
        """The verifier key of a checkpoint of ``size`` entries (default: the tree's)."""
        with self.store.read() as cur:
            n = self.store.size(cur) if size is None else size
            return self._history(cur).note_key_for(n)

    def checkpoint(self, key: Signers, *, catch_up: bool = True) -> SignedNote:
        """A checkpoint of the tree, signed with the journal's key for its size (``key``
        may be all of the journal's keys: the right one is used)."""
        if catch_up:
            self.catch_up()
        size, root = self.root()
        self.check_head(size)
        signer = self.signer_for(key, size)
        return sign_checkpoint(
            Checkpoint(origin=self.origin, size=size, root=root), self.origin, signer
        )

    def publish(self, note: SignedNote) -> None:
        size = Checkpoint.parse(note.text).size
        with self.store.write() as cur:
            self.store.publish(cur, size, note.render(), now_ms())

    def frame(self, position: int) -> bytes:
        """The entry frame (leaf input) of the entry at ``position``, from its stored bytes."""
        row = next(self.journal.rows(position, position), None)
        if row is None or row.position != position:
            raise NotInTreeError(f"the journal has no entry at position {position}")
        return entry_frame(
            row.prev_hash, position, row.originator, row.version, row.topic.encode(), row.state
        )

    def tlog_proof(self, position: int, key: Signers, size: int | None = None) -> InclusionText:
        """A C2SP tlog-proof of the entry at ``position``: its frame, its audit path and
        a checkpoint of the tree of ``size`` leaves signed with the journal's key."""
        self.catch_up()
        proof = self.inclusion(position, size)
        self.check_head(self.size())
        frame = self.frame(position)
        if merkle_leaf_hash(frame) != proof.leaf_hash:
            raise TreeFollowError(f"entry {position} no longer hashes to its stored leaf")
        checkpoint = Checkpoint(origin=self.origin, size=proof.size, root=proof.root)
        note = sign_checkpoint(checkpoint, self.origin, self.signer_for(key, proof.size))
        return InclusionText(frame=frame, index=proof.leaf, path=proof.path, note=note)

    def check_head(self, size: int) -> None:
        """Refuse (:class:`TreeAheadError`) a tree of ``size`` leaves whose last leaf is
        not the journal's entry at that leaf's position, byte for byte and chained: after
        a tail cut the stored tree would otherwise be signed past the journal's head."""
        if size == 0:
            return
        with self.store.read() as cur:
            position = self.store.position_of(cur, size - 1)
            stored = self.store.nodes(cur, [(0, size - 1)]).get((0, size - 1))
        row = next(self.journal.rows(position, position), None) if position else None
        if row is None or row.position != position or stored is None:
            raise TreeAheadError(
                f"the Merkle tree has {size} leaves but the journal has no entry at position "
                f"{position} (leaf {size - 1}): its tail was cut; nothing is signed past the "
                "journal's head (run `charter journal verify`)"
            )
        frame = entry_frame(
            row.prev_hash, position, row.originator, row.version, row.topic.encode(), row.state
        )
        if merkle_leaf_hash(frame) != stored or sha256(frame).digest() != row.chain_hash:
            raise TreeAheadError(
                f"the journal's entry at position {position} is not the tree's leaf "
                f"{size - 1}: nothing is signed over it (run `charter journal verify`)"
            )

    def signer_for(self, key: Signers, size: int) -> SigningKey:
        """The one of ``key`` that signs a checkpoint of ``size`` entries."""
        wanted = self.note_key(size).public_key
        for candidate in (key,) if isinstance(key, SigningKey) else key:
            if bytes(candidate.verify_key) == wanted:
                return candidate
        raise StateError(
            f"this key is not the journal's signing key for a checkpoint of {size} "
            "entries (CHARTER_HOME must be the home `charter init` made for this "
            "journal, holding its rotated keys)"
        )

    def latest(self) -> SignedNote | None:
        with self.store.read() as cur:
            found = self.store.checkpoints(cur)
        return SignedNote.parse(found[0][1]) if found else None


@dataclass(frozen=True)
class ExtensionReport:
    """``journal verify --checkpoint``: the journal extends the checkpoint."""

    ok: bool
    checkpoint_size: int
    size: int
    root: str
    proof: ConsistencyProof | None

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checkpoint_size": self.checkpoint_size,
            "size": self.size,
            "root": self.root,
            "consistency": self.proof.to_json() if self.proof else None,
        }


def verify_extension(
    journal: JournalReader, note: SignedNote, key: NoteKey | None = None
) -> ExtensionReport:
    """Prove the journal as it stands extends the checkpoint ``note``: every leaf is
    recomputed from the stored bytes, the checkpoint's signature verifies under the key
    the journal's key history (from ``key``, the anchor, default the journal's first
    key, through every valid rotation) gives for its size, the root at its size must be
    its root, and the stored tree's consistency proof must verify between them. Raises
    :class:`ConsistencyProofError` for a cut tail or a rewritten history."""
    log = MerkleLog(journal)
    claimed = Checkpoint.parse(note.text)
    anchor = key or log.anchor_key()
    history = KeyHistory.start(log.origin, anchor.public_key)
    frontier: list[tuple[int, bytes]] = []
    size = 0
    old_root = merkle.EMPTY_ROOT if claimed.size == 0 else None
    for _, leaf, topic, state in leaf_hashes(journal):
        if topic.startswith(ROTATION_TOPIC):
            history = _rotate(history, size, state)
        merkle.append_leaves(frontier, size, (leaf,))
        size += 1
        if size == claimed.size:
            old_root = merkle.root_from_frontier(frontier)
    checkpoint = verify_checkpoint(note, history.note_key_for(claimed.size))
    if size < checkpoint.size or old_root is None:
        raise ConsistencyProofError(
            f"the journal has {size} entries, fewer than the {checkpoint.size} of the "
            "checkpoint: its tail was cut off"
        )
    if old_root != checkpoint.root:
        raise ConsistencyProofError(
            f"the journal's first {checkpoint.size} entries do not hash to the checkpoint's "
            "root: history up to the checkpoint was rewritten"
        )
    new_root = merkle.root_from_frontier(frontier) if size else merkle.EMPTY_ROOT
    log.catch_up()
    proof = log.consistency(checkpoint.size, size)
    if proof.new_root != new_root or proof.old_root != old_root:
        raise ConsistencyProofError(
            "the stored Merkle tree does not match the journal's entries (its tables were "
            "changed): proofs served from it cannot be trusted"
        )
    merkle.verify_consistency(checkpoint.size, size, checkpoint.root, new_root, proof.path)
    return ExtensionReport(
        ok=True, checkpoint_size=checkpoint.size, size=size, root=new_root.hex(), proof=proof
    )
