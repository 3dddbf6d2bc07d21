"""Chain verification attacks no other test made (issue 14), each beside a control.

- an entry deleted and its successor relinked consistently (its link rewritten to the
  entry before the gap): caught only because the predecessor's hash is in the framing;
- a history rewritten from some position and re-chained: the chain alone verifies, a
  recorded head (``--expect-head``) catches it as "diverged";
- the position column changed;
- the public raising verifier (``verify_chain``) given a bad chain.

The pure walk is attacked here over an in-memory source (``_memory.py``: the journal's
verification interface, rows framed independently); ``test_chain_real.py`` makes the
same attacks on real SQLite and PostgreSQL journals with their guards dropped.
"""

from __future__ import annotations

import itertools

import pytest

from charter.audit import (
    ChainBrokenError,
    ChainHead,
    ChainReport,
    Fault,
    audit_chain,
    finish_report,
    parse_head,
    verify_chain,
)
from charter.core import BadInputError, TamperedError
from tests.audit._memory import MemorySource, Row, chained, entry

N = 12


def _head(rows: list[Row], position: int | None = None) -> ChainHead:
    row = rows[-1] if position is None else next(r for r in rows if r[0] == position)
    return ChainHead(position=row[0], hash=row[6].hex())


def _without(rows: list[Row], position: int) -> list[Row]:
    return [r for r in rows if r[0] != position]


def _relinked(rows: list[Row], position: int) -> list[Row]:
    """Delete the entry at ``position`` and point its successor at the entry before it."""
    before = next(r for r in rows if r[0] == position - 1)
    out = []
    for r in _without(rows, position):
        out.append((*r[:5], before[6], r[6]) if r[0] == position + 1 else r)
    return out


def _rechained(rows: list[Row], start: int, salt: int = 1000) -> list[Row]:
    """Rewrite every entry from ``start`` on with other contents, re-chained."""
    kept = [r for r in rows if r[0] < start]
    prev = kept[-1][6] if kept else bytes(32)
    return kept + chained([r[0] for r in rows if r[0] >= start], prev, salt)


# -- the pure walk over an in-memory source ------------------------------------------------


def test_an_untouched_chain_verifies_in_full_and_by_range() -> None:
    rows = chained(list(range(1, N + 1)))
    source = MemorySource(rows)
    seen: list[int] = []
    report = audit_chain(source, expect_head=_head(rows), progress=seen.append)
    assert report == ChainReport(ok=True, checked=N, head=_head(rows))
    assert seen == [4, 8, 12]  # once a batch, counting up
    part = audit_chain(source, start=5, stop=9)
    assert (part.ok, part.checked, part.head) == (True, 5, _head(rows, 9))
    assert verify_chain(source, start=5).checked == N - 4
    # Gaps in positions are legitimate (PostgreSQL sequences): the chain links by row.
    gappy = chained([1, 2, 5, 9, 10])
    assert audit_chain(MemorySource(gappy), start=5).checked == 3
    assert audit_chain(MemorySource(gappy)).head == _head(gappy)
    empty = audit_chain(MemorySource([]))
    assert (empty.ok, empty.checked, empty.head) == (True, 0, None)


def test_a_deleted_entry_with_its_successor_relinked_is_caught_at_the_successor() -> None:
    rows = chained(list(range(1, N + 1)))
    relinked = _relinked(rows, 7)
    # Every link in the relinked chain matches the stored hash before it ...
    for above, below in itertools.pairwise(relinked):
        assert below[5] == above[6]
    report = audit_chain(MemorySource(relinked))
    # ... so only the predecessor's hash inside entry 8's own hash gives it away.
    assert (report.ok, report.first_bad_position, report.fault) == (False, 8, Fault.CHANGED)
    assert (report.checked, report.head) == (6, _head(rows, 6))
    # Control: without the relink it is a missing predecessor, reported at the same place.
    plain = audit_chain(MemorySource(_without(rows, 7)))
    assert (plain.first_bad_position, plain.fault) == (8, Fault.MISSING)
    assert plain.reason == (
        "its predecessor is not in the journal: an entry before it was deleted, or its "
        "link was altered"
    )
    assert report.reason == "its stored bytes do not match its hash (the entry was changed)"


@pytest.mark.parametrize("start", [1, 5, N])
def test_a_history_rewritten_from_a_position_diverges_from_a_recorded_head(start: int) -> None:
    rows = chained(list(range(1, N + 1)))
    forged = MemorySource(_rechained(rows, start))
    assert audit_chain(forged).ok  # a consistent re-chain fools the chain alone
    report = audit_chain(forged, expect_head=_head(rows))
    assert (report.ok, report.first_bad_position, report.fault) == (False, N, Fault.DIVERGED)
    assert report.checked == N
    assert report.head == _head(forged.rows)
    assert report.reason == (
        f"entry {N} has hash {forged.rows[-1][6].hex()}, but the recorded head says "
        f"{_head(rows).hash}: history was rewritten"
    )
    # A head recorded inside the rewritten part diverges there too; one recorded before
    # the rewrite still matches (the prefix is genuine).
    inside = audit_chain(forged, expect_head=_head(rows, start))
    assert (inside.first_bad_position, inside.fault) == (start, Fault.DIVERGED)
    if start > 1:
        assert audit_chain(forged, expect_head=_head(rows, start - 1)).ok


def test_a_rewritten_and_extended_history_still_diverges() -> None:
    rows = chained(list(range(1, N + 1)))
    rewritten = _rechained(rows, 4)
    forged = MemorySource([*rewritten, entry(rewritten[-1][6], N + 1, 0)])
    assert audit_chain(forged).ok
    report = audit_chain(forged, expect_head=_head(rows))
    assert (report.first_bad_position, report.fault) == (N, Fault.DIVERGED)


def test_a_truncated_journal_is_reported_after_its_last_entry() -> None:
    rows = chained(list(range(1, N + 1)))
    cut = MemorySource(rows[:8])
    report = audit_chain(cut, expect_head=_head(rows))
    assert (report.ok, report.first_bad_position, report.fault) == (False, 9, Fault.TRUNCATED)
    assert (report.checked, report.head) == (8, _head(rows, 8))
    assert report.reason == (
        f"a head at position {N} was recorded, but the journal has no entry there (it ends "
        "at 8): the tail was cut off"
    )
    # A range that stops early, checked against a head past the gap of a deleted entry.
    holed = MemorySource(_without(rows, 10))
    gap = audit_chain(holed, stop=9, expect_head=_head(rows, 10))
    assert (gap.first_bad_position, gap.fault) == (10, Fault.TRUNCATED)
    # A head beyond the range walked but present in the journal is compared, not "cut".
    assert audit_chain(MemorySource(rows), stop=5, expect_head=_head(rows)).ok
    nothing = audit_chain(MemorySource([]), expect_head=_head(rows))
    assert (nothing.first_bad_position, nothing.fault, nothing.checked) == (
        1,
        Fault.TRUNCATED,
        0,
    )


@pytest.mark.parametrize("moved_to", [13, 100])
def test_a_changed_position_column_is_caught(moved_to: int) -> None:
    rows = chained(list(range(1, N + 1)))
    last = rows[-1]
    moved = MemorySource([*rows[:-1], (moved_to, *last[1:])])
    report = audit_chain(moved)
    assert (report.first_bad_position, report.fault) == (moved_to, Fault.CHANGED)
    # In the middle: entries 6.. renumbered upwards by one (no collisions) break at 7.
    shifted = MemorySource([r if r[0] < 6 else (r[0] + 1, *r[1:]) for r in rows])
    mid = audit_chain(shifted)
    assert (mid.first_bad_position, mid.fault) == (7, Fault.CHANGED)
    assert audit_chain(MemorySource(rows)).ok  # control


def test_every_link_fault_is_named() -> None:
    rows = chained(list(range(1, N + 1)))
    # Reordered: entries 5 and 9 swapped in place.
    swapped = [
        (r[0], *rows[8][1:]) if r[0] == 5 else (r[0], *rows[4][1:]) if r[0] == 9 else r
        for r in rows
    ]
    reordered = audit_chain(MemorySource(swapped))
    assert (reordered.first_bad_position, reordered.fault) == (5, Fault.REORDERED)
    assert reordered.reason == (
        "it links to the entry at position 8, not to the entry before it (position 4): "
        "entries were reordered"
    )
    # The first entry linking into the journal: "the entry before it" is position 0.
    into = [(*rows[0][:5], rows[2][6], rows[0][6]), *rows[1:]]
    first_reordered = audit_chain(MemorySource(into))
    assert (first_reordered.first_bad_position, first_reordered.fault) == (1, Fault.REORDERED)
    assert "(position 0)" in (first_reordered.reason or "")
    # Broken link: it names the entry two before (which is in the journal, so not
    # missing) ... that is a reordering too; a link to the entry itself is "broken".
    self_link = [(*r[:5], r[6], r[6]) if r[0] == 6 else r for r in rows]
    broken = audit_chain(MemorySource(self_link))
    assert (broken.first_bad_position, broken.fault) == (6, Fault.REORDERED)
    to_prev = [(*r[:5], rows[4][6], r[6]) if r[0] == 7 else r for r in rows]
    skipped = audit_chain(MemorySource(to_prev))
    assert (skipped.first_bad_position, skipped.fault) == (7, Fault.REORDERED)
    # A range starting at the first entry: its predecessor is genesis.
    first = [(*rows[0][:5], b"\x01" * 32, rows[0][6]), *rows[1:]]
    missing = audit_chain(MemorySource(first), start=1)
    assert (missing.first_bad_position, missing.fault, missing.head) == (1, Fault.MISSING, None)


def test_a_link_to_the_entry_just_before_with_other_bytes_is_a_broken_link() -> None:
    """The link names the right predecessor position but the walk's hash differs: only
    possible when the source's look-up and its rows disagree, and it is still refused."""
    rows = chained(list(range(1, N + 1)))

    class Lying(MemorySource):
        def position_of_hash(self, chain_hash: bytes) -> int | None:
            return 6

    linked = [(*r[:5], b"\x02" * 32, r[6]) if r[0] == 7 else r for r in rows]
    report = audit_chain(Lying(linked))
    assert (report.first_bad_position, report.fault) == (7, Fault.BROKEN_LINK)
    assert report.reason == "its link does not match the hash of the entry before it"
    assert (report.checked, report.head) == (6, _head(rows, 6))


def test_a_column_that_no_longer_decodes_is_a_changed_entry() -> None:
    rows = chained(list(range(1, N + 1)))
    for bad in (
        (*rows[3][:2], -(2**64), *rows[3][3:]),  # out of the framing's range
        (*rows[3][:2], 1.5, *rows[3][3:]),  # SQLite stores a REAL in an INTEGER column
        (*rows[3][:3], rows[3][3].encode(), *rows[3][4:]),  # ... and a BLOB in a TEXT one
        (*rows[3][:4], None, *rows[3][5:]),
    ):
        report = audit_chain(MemorySource([*rows[:3], bad, *rows[4:]]))
        assert (report.first_bad_position, report.fault) == (4, Fault.CHANGED)
        assert report.reason == "its stored bytes do not match its hash (the entry was changed)"
        # Fail closed: whatever hash it stores (one the database would refuse, but its
        # checks can be dropped), an entry that does not decode never verifies.
        for stored in (b"", None, b"XXXX", "x"):
            last = (*bad[:6], stored)
            report = audit_chain(MemorySource([*rows[:3], last]))
            assert (report.ok, report.first_bad_position, report.fault) == (
                False,
                4,
                Fault.CHANGED,
            )


def test_a_broken_link_is_reported_even_when_the_entry_does_not_decode() -> None:
    rows = chained(list(range(1, N + 1)))
    garbled = [(r[0], "zz", *r[2:5], b"\x01" * 32, r[6]) if r[0] == 3 else r for r in rows]
    report = audit_chain(MemorySource(garbled))
    assert (report.first_bad_position, report.fault) == (3, Fault.MISSING)


def test_a_range_past_the_end_reports_the_entry_before_it() -> None:
    rows = chained(list(range(1, N + 1)))
    report = audit_chain(MemorySource(rows), start=N + 1)
    assert report == ChainReport(ok=True, checked=0, head=_head(rows))


def test_a_rechained_journal_missing_the_recorded_heads_position() -> None:
    """Entry 6 deleted and everything after it re-chained: the walk passes position 6,
    and the head recorded there is reported at 6 (not after the journal's end)."""
    rows = chained(list(range(1, N + 1)))
    kept = [r for r in rows if r[0] < 6]
    forged = MemorySource(kept + chained(list(range(7, N + 1)), kept[-1][6], salt=7))
    assert audit_chain(forged).ok
    report = audit_chain(forged, expect_head=_head(rows, 6))
    assert (report.first_bad_position, report.fault) == (6, Fault.TRUNCATED)


def test_the_public_verifier_raises_on_a_bad_chain_and_returns_on_a_good_one() -> None:
    rows = chained(list(range(1, N + 1)))
    good = verify_chain(MemorySource(rows), expect_head=_head(rows))
    assert good.ok
    assert good.head == _head(rows)
    for source, head, where in (
        (MemorySource(_relinked(rows, 7)), None, 8),
        (MemorySource(_rechained(rows, 3)), _head(rows), N),
        (MemorySource(rows[:6]), _head(rows), 7),
    ):
        with pytest.raises(ChainBrokenError) as caught:
            verify_chain(source, expect_head=head)
        assert isinstance(caught.value, TamperedError)
        assert caught.value.report.first_bad_position == where
        assert not caught.value.report.ok
        assert f"position {where}" in str(caught.value)
    with pytest.raises(ChainBrokenError):
        verify_chain(MemorySource(_relinked(rows, 7)), start=8)
    # The range is honoured: a break after ``stop`` is outside what was asked.
    assert verify_chain(MemorySource(_relinked(rows, 7)), stop=6).checked == 6


def test_finish_report_and_the_json_document() -> None:
    rows = chained(list(range(1, N + 1)))
    source = MemorySource(rows)
    assert finish_report(source, N, _head(rows), None) == ChainReport(
        ok=True, checked=N, head=_head(rows)
    )
    report = finish_report(source, 3, _head(rows, 3), _head(rows, 5))
    assert report.ok  # a recorded head that is still in the journal unchanged
    doc = audit_chain(MemorySource(rows[:4]), expect_head=_head(rows)).to_json()
    assert doc == {
        "ok": False,
        "checked": 4,
        "head": {"position": 4, "hash": rows[3][6].hex()},
        "first_bad_position": 5,
        "fault": "truncated",
        "reason": doc["reason"],
    }
    assert ChainReport(ok=True, checked=0, head=None).to_json()["head"] is None
    assert ChainReport(ok=True, checked=0, head=None).to_json()["fault"] is None


def test_a_recorded_head_is_read_strictly() -> None:
    digest = "aB" * 32
    assert parse_head(f"12:{digest}") == ChainHead(position=12, hash=digest.lower())
    for bad in (
        f"x:{digest}",
        f"-1:{digest}",
        f"12:{digest[:-1]}",
        f"12:{digest}0",
        f"12:{digest[:-1]}g",
        f"12{digest}",
        "12:" + "X" * 64,
        "",
    ):
        with pytest.raises(BadInputError, match="POS:HASH"):
            parse_head(bad)


def test_a_report_and_a_head_are_frozen() -> None:
    from pydantic import ValidationError

    rows = chained([1, 2])
    report = audit_chain(MemorySource(rows))
    head = report.head
    assert head is not None
    with pytest.raises(ValidationError, match="frozen"):
        report.ok = False  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        head.hash = "00" * 32  # type: ignore[misc]
    assert (report.ok, head.hash) == (True, rows[-1][6].hex())
    with pytest.raises(ValidationError, match="Extra inputs"):
        ChainHead(position=1, hash="00" * 32, signed=True)  # type: ignore[call-arg]
