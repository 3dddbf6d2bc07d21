"""The chain attacks of ``test_chain_noticed.py`` on real SQLite and PostgreSQL journals,
with the database's append-only guards dropped first (what an attacker with database
access does), and through ``charter journal verify`` where the CLI decides the exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from charter.audit import ChainHead, ChainReport, Fault, audit_chain
from charter.audit.journal import audit_journal
from charter.ledger import Journal
from tests.audit._memory import ref_entry_hash
from tests.journal._support import Ping
from tests.journal.test_contract import _Raw

N = 12


@pytest.fixture
def real(journal_url: str) -> Iterator[tuple[str, ChainHead, _Raw]]:
    with Journal.create(journal_url) as j:
        for b in range(N // 3):
            j.append([Ping(writer="w", batch=b, n=i) for i in range(3)])
        head = j.head()
    assert head is not None
    with _Raw(journal_url) as raw:
        raw.drop_guards()
        yield journal_url, ChainHead(position=head[0], hash=head[1].hex()), raw


def _report(url: str, head: ChainHead | None = None) -> ChainReport:
    with Journal.open(url) as j:
        walked = audit_chain(j, expect_head=head)
        assert audit_journal(j, expect_head=head) == walked  # the CLI's entry point agrees
        return walked


def _stored(url: str) -> list[tuple[Any, ...]]:
    with Journal.open(url) as j:
        return [(*row, j.originator_bytes(row[1])) for b in j.batches() for row in b]


def test_a_real_journal_with_an_entry_deleted_and_relinked(
    real: tuple[str, ChainHead, _Raw],
) -> None:
    url, head, raw = real
    assert _report(url, head).ok
    rows = _stored(url)
    raw.execute(f"DELETE FROM {raw.table} WHERE {raw.pos} = 7")
    raw.execute(f"UPDATE {raw.table} SET prev_hash = ? WHERE {raw.pos} = 8", (bytes(rows[5][6]),))
    report = _report(url)
    assert (report.ok, report.first_bad_position, report.fault) == (False, 8, Fault.CHANGED)


def _rewrite_from(url: str, raw: _Raw, start: int) -> None:
    """What an attacker with write access does: change an entry, re-chain the rest."""
    rows = _stored(url)
    prev = bytes(rows[start - 2][6]) if start > 1 else bytes(32)
    for pos, _, version, topic, stored, _, _, originator in rows[start - 1 :]:
        state = b'{"batch":0,"n":99,"pad":"","writer":"mallory"}' if pos == start else stored
        new = ref_entry_hash(prev, pos, originator, version, topic.encode(), bytes(state))
        raw.execute(
            f"UPDATE {raw.table} SET state = ?, prev_hash = ?, chain_hash = ? WHERE {raw.pos} = ?",
            (bytes(state), prev, new, pos),
        )
        prev = new


def _charter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "charter", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
        check=False,
    )


def test_a_real_journal_rewritten_from_a_position_fails_expect_head(
    real: tuple[str, ChainHead, _Raw],
) -> None:
    url, head, raw = real
    expect = f"{head.position}:{head.hash}"
    _rewrite_from(url, raw, 5)
    assert _report(url).ok  # the re-chained journal verifies on its own
    report = _report(url, head)
    assert (report.ok, report.first_bad_position, report.fault) == (False, N, Fault.DIVERGED)
    alone = _charter("--db", url, "--json", "journal", "verify")
    assert alone.returncode == 0, alone.stderr
    cli = _charter("--db", url, "--json", "journal", "verify", "--expect-head", expect)
    assert cli.returncode == 3, cli.stderr
    doc = json.loads(cli.stdout)
    assert (doc["ok"], doc["fault"], doc["first_bad_position"]) == (False, "diverged", N)


@pytest.mark.parametrize(
    "change",
    [
        "originator_version = 1.5",
        "topic = CAST(topic AS BLOB)",
        "originator_id = 'zz', prev_hash = X'" + "01" * 32 + "'",  # and the link: a link fault
    ],
    ids=["real version", "blob topic", "bad originator and link"],
)
def test_a_real_sqlite_column_of_another_type_is_a_changed_entry(
    sqlite_url: str, change: str
) -> None:
    """SQLite keeps whatever type is written: a REAL version or a BLOB topic is a
    changed entry (exit 3 at its position), not an internal error (exit 1, as before);
    so is an originator that does not decode on an entry whose link is broken too."""
    with Journal.create(sqlite_url) as j:
        j.append([Ping(writer="w", batch=0, n=i) for i in range(3)])
    assert _charter("--db", sqlite_url, "journal", "verify").returncode == 0
    with _Raw(sqlite_url) as raw:
        raw.drop_guards()
        raw.execute(f"UPDATE {raw.table} SET {change} WHERE {raw.pos} = 2")
    report = _report(sqlite_url)
    fault = Fault.MISSING if "prev_hash" in change else Fault.CHANGED
    assert (report.ok, report.first_bad_position, report.fault) == (False, 2, fault)
    cli = _charter("--db", sqlite_url, "journal", "verify")
    assert cli.returncode == 3, cli.stderr
    assert "position 2" in cli.stderr


def test_a_real_journal_with_its_position_column_changed(
    real: tuple[str, ChainHead, _Raw],
) -> None:
    url, head, raw = real
    raw.execute(f"UPDATE {raw.table} SET {raw.pos} = ? WHERE {raw.pos} = ?", (N + 5, N))
    report = _report(url)
    assert (report.ok, report.first_bad_position, report.fault) == (False, N + 5, Fault.CHANGED)
    raw.execute(f"UPDATE {raw.table} SET {raw.pos} = ? WHERE {raw.pos} = ?", (N, N + 5))
    assert _report(url, head).ok  # control: moved back, it verifies
