"""The Merkle follower over a real journal (SQLite and PostgreSQL): the stored tree is
the RFC 6962 tree of the entries' frames, proofs from it verify, and a checkpoint saved
earlier catches a cut tail, a consistent re-hash and a swapped pair."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator

import pytest

from charter.audit import audit_chain
from charter.audit.errors import (
    ConsistencyProofError,
    NoteSignatureError,
    NotInTreeError,
    TreeFollowError,
)
from charter.audit.note import Checkpoint, SignedNote, sign_checkpoint
from charter.audit.tree import MerkleLog, verify_extension
from charter.core.errors import StateError
from charter.core.framing import entry_frame
from charter.ledger import Journal
from tests.audit import rfc6962
from tests.audit._support import _Raw, fill, make_journal, rehash_from


def _naive_leaves(journal: Journal) -> list[tuple[int, bytes]]:
    """Leaf hashes written from the documented definition: sha256(0x00 ‖ frame)."""
    out = []
    for row in journal.rows():
        frame = entry_frame(
            row.prev_hash, row.position, row.originator, row.version, row.topic.encode(), row.state
        )
        out.append((row.position, rfc6962.leaf(frame)))
    return out


@pytest.fixture
def logged(journal_url: str) -> Iterator[tuple[str, Journal, MerkleLog, object]]:
    journal, key = make_journal(journal_url)
    fill(journal, 7)
    log = MerkleLog(journal)
    try:
        yield journal_url, journal, log, key
    finally:
        journal.close()


def test_the_stored_tree_is_the_rfc_tree_of_the_entries(logged: tuple) -> None:
    _, journal, log, _ = logged
    sizes = []
    for more in (0, 1, 5, 2):
        fill(journal, more, tag=f"m{more}")
        sizes.append(log.catch_up(chunk=4))  # several transactions per step
        naive_leaves = _naive_leaves(journal)
        naive = rfc6962.Naive([h for _, h in naive_leaves])
        size, root = log.root()
        assert size == len(naive_leaves)
        assert root == naive.mth(0, size)
        for leaf, (position, leaf_hash) in enumerate(naive_leaves):
            proof = log.inclusion(position)
            assert (proof.leaf, proof.leaf_hash) == (leaf, leaf_hash)
            assert list(proof.path) == naive.path(leaf, 0, size)
            proof.verify()
    for old in range(sizes[-1] + 1):
        proof = log.consistency(old)
        proof.verify()
        assert list(proof.path) == (naive.proof(old, sizes[-1]) if 0 < old < sizes[-1] else [])
    assert log.tracked() == journal.head()[0]


def test_a_second_follower_continues_where_the_first_committed(logged: tuple) -> None:
    url, journal, log, _ = logged
    log.catch_up(stop=5)
    with Journal.open(url) as other:
        second = MerkleLog(other)
        assert second.tracked() == 5
        size = second.catch_up()
    assert log.catch_up() == size  # nothing left; the first sees the second's commit
    assert log.root() == (size, rfc6962.Naive([h for _, h in _naive_leaves(journal)]).mth(0, size))


def test_proofs_outside_the_tree_are_refused(logged: tuple) -> None:
    _, journal, log, _ = logged
    size = log.catch_up()
    with pytest.raises(NotInTreeError):
        log.inclusion(journal.head()[0] + 1)
    with pytest.raises(NotInTreeError):
        log.root(size + 1)
    with pytest.raises(NotInTreeError):
        log.consistency(size + 1)


def test_checkpoints_sign_the_tree_and_verify_extension_accepts_a_grown_journal(
    logged: tuple,
) -> None:
    _, journal, log, key = logged
    note = log.checkpoint(key)
    saved = SignedNote.parse(note.render())
    fill(journal, 3, tag="later")
    report = verify_extension(journal, saved)
    assert report.ok
    assert report.size > report.checkpoint_size
    assert verify_extension(journal, saved).proof is not None
    with pytest.raises(StateError):
        log.checkpoint(type(key).generate())  # not the journal's key
    log.publish(note)
    assert log.latest() == note


def test_a_checkpoint_by_another_key_is_refused(logged: tuple) -> None:
    _, _, log, key = logged
    note = log.checkpoint(key)
    forged = sign_checkpoint(Checkpoint.parse(note.text), log.origin, type(key).generate())
    with pytest.raises(NoteSignatureError):
        verify_extension(log.journal, forged)


@pytest.fixture
def saved(logged: tuple) -> Iterator[tuple[str, SignedNote, _Raw, MerkleLog]]:
    url, journal, log, key = logged
    note = SignedNote.parse(log.checkpoint(key).render())
    verify_extension(journal, note)  # positive control: the untouched journal passes
    with _Raw(url) as raw:
        raw.drop_guards()
        yield url, note, raw, log


def _positions(url: str) -> list[int]:
    with Journal.open(url) as j:
        return [r.position for r in j.rows()]


def test_a_cut_tail_is_caught(saved: tuple) -> None:
    url, note, raw, _ = saved
    last = _positions(url)[-1]
    raw.execute(f"DELETE FROM {raw.table} WHERE {raw.pos} >= ?", (last - 2,))
    with Journal.open(url) as j, pytest.raises(ConsistencyProofError, match="tail was cut"):
        verify_extension(j, note)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_consistent_rehash_from_any_position_is_caught(saved: tuple, where: str) -> None:
    url, note, raw, _ = saved
    positions = _positions(url)
    position = {"first": positions[0], "middle": positions[len(positions) // 2]}.get(
        where, positions[-1]
    )
    with Journal.open(url) as j:
        state = next(r.state for r in j.rows(position, position))
    rehash_from(url, raw, position, state.replace(b'"w"', b'"x"', 1) + b" ")
    with Journal.open(url) as j:
        assert audit_chain(j).ok  # the chain alone no longer shows it
        with pytest.raises(ConsistencyProofError, match="rewritten"):
            verify_extension(j, note)


def test_a_swapped_pair_is_caught(saved: tuple) -> None:
    url, note, raw, _ = saved
    positions = _positions(url)
    a, b = positions[3], positions[4]
    with Journal.open(url) as j:
        rows = {r.position: r for r in j.rows(a, b)}
    raw.execute(f"UPDATE {raw.table} SET state = ? WHERE {raw.pos} = ?", (rows[b].state, a))
    raw.execute(f"UPDATE {raw.table} SET state = ? WHERE {raw.pos} = ?", (rows[a].state, b))
    with Journal.open(url) as j, pytest.raises(TreeFollowError):
        verify_extension(j, note)  # swapped but not re-hashed: the chain breaks
    rehash_from(url, raw, a)
    with Journal.open(url) as j, pytest.raises(ConsistencyProofError, match="rewritten"):
        verify_extension(j, note)


def test_a_stale_stored_tree_is_refused(logged: tuple) -> None:
    """Entries after the checkpoint re-hashed, the tree's tables left as they were: the
    checkpoint's part still matches, but verification recomputes every leaf, so the stored
    tree (which proofs are served from) is found out instead of being trusted."""
    url, journal, log, key = logged
    note = SignedNote.parse(log.checkpoint(key).render())
    fill(journal, 2, tag="after")
    log.catch_up()
    verify_extension(journal, note)  # positive control
    with _Raw(url) as raw:
        raw.drop_guards()
        rehash_from(url, raw, _positions(url)[-1], b"{}")
    with Journal.open(url) as j, pytest.raises(ConsistencyProofError, match="stored Merkle"):
        verify_extension(j, note)


def test_the_follower_publishes_a_checkpoint_covering_each_commit_within_the_bound(
    logged: tuple,
) -> None:
    import threading
    import time

    _, journal, log, key = logged
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with Journal.open(journal.location) as own:
                MerkleLog(own).follow(key, poll_s=0.01, publish_every_s=0.2, until=stop.is_set)
        except BaseException as e:  # surfaced below
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        for round_ in range(3):
            fill(journal, 1, tag=f"r{round_}")
            committed = journal.head()[0]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not errors:
                latest = log.latest()
                if latest is not None:
                    size = Checkpoint.parse(latest.text).size
                    if size and log.position_of_leaf(size - 1) == committed:
                        break
                time.sleep(0.02)
            else:
                pytest.fail(f"no checkpoint covered position {committed}: {errors}")
            verify_extension(journal, latest)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors


def test_tlog_proofs_at_an_earlier_size_verify_and_name_their_entry(logged: tuple) -> None:
    from charter.audit.errors import InclusionProofError
    from charter.audit.proofs import InclusionText

    _, journal, log, key = logged
    log.catch_up()
    rows = list(journal.rows())
    early = rows[3].position
    made = log.tlog_proof(early, key, size=6)
    parsed = InclusionText.parse(made.render())
    checkpoint = parsed.verify(log.note_key())
    assert (checkpoint.size, parsed.index) == (6, 3)
    assert hashlib.sha256(parsed.frame).digest() == rows[3].chain_hash  # names the entry
    with pytest.raises(NotInTreeError):
        log.tlog_proof(rows[7].position, key, size=6)  # not in the tree of 6
    moved = dataclasses.replace(parsed, index=4)
    with pytest.raises(InclusionProofError):
        moved.verify(log.note_key())
