"""Tampering as an attacker with database access would do it (guards dropped first).

Each attack is reported at the right position; each test restores or compares against
an untouched journal first, so it is shown that verification could also pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from charter.audit import ChainHead, Fault, audit_chain
from charter.ledger import Journal

from ._support import Counter, Ping
from .test_contract import _Raw

N = 24
COLUMNS = ("state", "topic", "originator_id", "originator_version", "prev_hash", "chain_hash")


def _fill(url: str) -> ChainHead:
    with Journal.create(url) as j:
        for b in range(N // 4):
            j.append(
                [
                    Ping(writer="w", batch=b, n=0, pad="p" * b),
                    Counter(name="c", value=b),
                    Ping(writer="w", batch=b, n=1),
                    Counter(name=f"d{b}", value=b),
                ]
            )
        head = j.head()
        assert head is not None
        return ChainHead(position=head[0], hash=head[1].hex())


@pytest.fixture
def tampered(journal_url: str) -> Iterator[tuple[str, ChainHead, _Raw]]:
    head = _fill(journal_url)
    with _Raw(journal_url) as raw:
        raw.drop_guards()
        yield journal_url, head, raw


def _audit(url: str, head: ChainHead | None = None) -> Any:
    with Journal.open(url) as j:
        return audit_chain(j, expect_head=head)


def _altered(value: Any, offset: int, bit: int) -> Any:
    if isinstance(value, int):
        return value + 1000 + offset
    if isinstance(value, str):
        i = offset % len(value)
        return value[:i] + ("0" if value[i] != "0" else "1") + value[i + 1 :]
    if hasattr(value, "bytes"):  # a PostgreSQL uuid
        import uuid

        b = bytearray(value.bytes)
        b[offset % 16] ^= 1 << bit
        return uuid.UUID(bytes=bytes(b))
    b = bytearray(value)
    b[offset % len(b)] ^= 1 << bit
    return bytes(b)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    position=st.integers(1, N),
    column=st.sampled_from(COLUMNS),
    offset=st.integers(0, 4096),
    bit=st.integers(0, 7),
)
def test_any_flipped_byte_is_found_at_its_position(
    tampered: tuple[str, ChainHead, _Raw], position: int, column: str, offset: int, bit: int
) -> None:
    url, _, raw = tampered
    where = f"{raw.pos} = ?"
    (original,) = raw.execute(f"SELECT {column} FROM {raw.table} WHERE {where}", (position,))[0]
    raw.execute(
        f"UPDATE {raw.table} SET {column} = ? WHERE {where}",
        (_altered(original, offset, bit), position),
    )
    try:
        report = _audit(url)
        assert not report.ok
        assert report.first_bad_position == position, report.reason
    finally:
        raw.execute(f"UPDATE {raw.table} SET {column} = ? WHERE {where}", (original, position))
    assert _audit(url).ok  # positive control: restored, it verifies again


def test_deleted_entry_is_reported_where_the_chain_breaks(
    tampered: tuple[str, ChainHead, _Raw],
) -> None:
    url, head, raw = tampered
    assert _audit(url, head).ok
    raw.execute(f"DELETE FROM {raw.table} WHERE {raw.pos} = 7")
    report = _audit(url)
    assert (report.ok, report.first_bad_position, report.fault) == (False, 8, Fault.MISSING)


def test_swapped_entries_are_reported_as_reordered(
    tampered: tuple[str, ChainHead, _Raw],
) -> None:
    url, _, raw = tampered
    assert _audit(url).ok
    cols = ", ".join(COLUMNS)
    a, b = (
        raw.execute(f"SELECT {cols} FROM {raw.table} WHERE {raw.pos} = ?", (p,))[0] for p in (5, 9)
    )
    # Move both out of the way (unique keys), then write each into the other's place.
    for p, filler in ((5, b"\x01" * 32), (9, b"\x02" * 32)):
        raw.execute(
            f"UPDATE {raw.table} SET prev_hash = ?, originator_version = originator_version "
            f"+ 100000 WHERE {raw.pos} = ?",
            (filler, p),
        )
    sets = ", ".join(f"{c} = ?" for c in COLUMNS)
    raw.execute(f"UPDATE {raw.table} SET {sets} WHERE {raw.pos} = 5", (*b,))
    raw.execute(f"UPDATE {raw.table} SET {sets} WHERE {raw.pos} = 9", (*a,))
    report = _audit(url)
    assert (report.ok, report.first_bad_position, report.fault) == (False, 5, Fault.REORDERED)


def test_truncated_tail_is_caught_against_a_recorded_head(
    tampered: tuple[str, ChainHead, _Raw],
) -> None:
    url, head, raw = tampered
    assert _audit(url, head).ok
    raw.execute(f"DELETE FROM {raw.table} WHERE {raw.pos} > 20")
    assert _audit(url).ok  # a chain alone cannot see a cut tail: hence the recorded head
    report = _audit(url, head)
    assert (report.ok, report.first_bad_position, report.fault) == (False, 21, Fault.TRUNCATED)


def _charter(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "charter", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )


def test_cli_verify_exits_3_naming_the_position(tampered: tuple[str, ChainHead, _Raw]) -> None:
    url, head, raw = tampered
    expect = f"{head.position}:{head.hash}"
    ok = _charter("--db", url, "--json", "journal", "verify", "--expect-head", expect)
    assert ok.returncode == 0, ok.stderr
    import json

    doc = json.loads(ok.stdout)
    assert doc["ok"] is True
    assert doc["checked"] == N
    assert doc["head"] == {"position": head.position, "hash": head.hash}

    raw.execute(f"UPDATE {raw.table} SET state = ? WHERE {raw.pos} = 11", (b'{"x":1}',))
    bad = _charter("--db", url, "journal", "verify")
    assert bad.returncode == 3
    assert "position 11" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    bad_json = _charter("--db", url, "--json", "journal", "verify")
    assert bad_json.returncode == 3
    doc = json.loads(bad_json.stdout)
    assert (doc["ok"], doc["first_bad_position"]) == (False, 11)
    assert doc["reason"]

    raw.execute(f"DELETE FROM {raw.table} WHERE {raw.pos} >= 11")
    assert _charter("--db", url, "journal", "verify").returncode == 0
    cut = _charter("--db", url, "journal", "verify", "--expect-head", expect)
    assert cut.returncode == 3
    assert "cut off" in cut.stderr


def test_parallel_chunks_report_what_one_walk_reports(
    tampered: tuple[str, ChainHead, _Raw],
) -> None:
    """Chunked verification in worker processes agrees with the single walk: intact,
    then with an entry changed in the third chunk, then with a link broken at a
    chunk boundary."""
    from charter.audit.journal import audit_journal

    url, head, raw = tampered

    def both() -> tuple[Any, Any]:
        with Journal.open(url) as j:
            chunked = audit_journal(j, expect_head=head, workers=2, chunk=5, parallel_min=0)
            return chunked, audit_chain(j, expect_head=head)

    chunked, walked = both()
    assert chunked.ok
    assert walked.ok
    assert chunked == walked
    raw.execute(f"UPDATE {raw.table} SET state = ? WHERE {raw.pos} = 13", (b'{"x":2}',))
    chunked, walked = both()
    assert (chunked.ok, chunked.first_bad_position, chunked.fault) == (False, 13, Fault.CHANGED)
    assert chunked.model_dump(exclude={"head"}) == walked.model_dump(exclude={"head"})
    raw.execute(f"DELETE FROM {raw.table} WHERE {raw.pos} = 10")  # 11 opens a chunk
    chunked, walked = both()
    assert (chunked.first_bad_position, chunked.fault) == (11, Fault.MISSING)
    assert chunked.model_dump(exclude={"head"}) == walked.model_dump(exclude={"head"})


@pytest.mark.parametrize("parallel", [False, True])
def test_progress_counts_up_to_the_size_of_the_range(journal_url: str, parallel: bool) -> None:
    from charter.audit.journal import audit_journal

    _fill(journal_url)
    calls: list[tuple[int, int]] = []
    with Journal.open(journal_url) as j:
        report = audit_journal(
            j,
            start=5,
            stop=20,
            progress=lambda *a: calls.append(a),
            workers=2 if parallel else 1,
            chunk=5,
            parallel_min=0,
        )
    assert report.ok
    assert report.checked == 16
    assert calls[-1] == (16, 16)
    assert all(total == 16 for _, total in calls)
