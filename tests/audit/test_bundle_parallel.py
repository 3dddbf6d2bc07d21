"""``export verify`` of a large whole-journal bundle (a regular file of at least
``PARALLEL_AUDIT_BYTES``) runs its semantic audit in a forked process beside the
checks: the same report as in one process (a finding included), and an audit that did
not read the sealed bytes counts for nothing (the file changed under it: refused, with
the in-process verification of the same file as the control). Both backends."""

from __future__ import annotations

import io
from pathlib import Path
from typing import IO, Any

import pytest

from charter.audit import bundle
from charter.audit.bundle import verify_bundle
from charter.audit.errors import BundleError
from charter.audit.export import export_bundle
from charter.audit.note import NoteKey
from charter.core import Budget, KeyStore
from charter.ledger import Journal
from tests.audit._support import real_history


@pytest.fixture
def found(journal_url: str, tmp_path: Path) -> tuple[Path, NoteKey, int]:
    """A whole bundle (a file) of a real history with one broken rule: (its path, the
    journal key, the bad entry's position)."""
    from charter.budgets import UsageRecorded

    home = tmp_path / "home"
    vkey, lineages = real_history(journal_url, home)
    zero = Budget.parse("tokens=0,wall=0s,cpu=0s,mem=0KiB,egress=0KB")
    big = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB")
    path = tmp_path / "bundle.jsonl"
    with Journal.open(journal_url) as j:
        (bad,) = j.append(
            [UsageRecorded(lineage=lineages[0], amount=big, refused=zero, exhausted=False)]
        )
        with path.open("wb") as f:
            export_bundle(j, KeyStore(home).load("journal"), f)
    return path, NoteKey.parse(vkey), bad.position


def _forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Audit every whole bundle file in a process of its own; returns the fds it forked
    for (so a test knows the other process did run)."""
    monkeypatch.setattr(bundle, "PARALLEL_AUDIT_BYTES", 0)
    started: list[int] = []
    real = bundle._SeparateAudit.start

    def start(stream: IO[bytes]) -> Any:
        made = real(stream)
        if made is not None:
            started.append(stream.fileno())
        return made

    monkeypatch.setattr(bundle._SeparateAudit, "start", start)
    return started


def test_the_separate_audit_reports_what_one_process_reports(
    found: tuple[Path, NoteKey, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, key, bad = found
    alone = verify_bundle(path.read_bytes(), key)  # bytes: audited in this process
    started = _forks(monkeypatch)
    with path.open("rb") as f:
        beside = verify_bundle(f, key)
    assert started  # the audit did run in the other process
    assert beside == alone
    assert not beside.ok
    assert [(f.check, f.position) for f in beside.findings] == [("conservation", bad)]


def test_an_audit_of_other_bytes_than_the_sealed_ones_is_refused(
    found: tuple[Path, NoteKey, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file changes between the checks and the audit (here: the audit process is
    handed a copy without the bad entry's line, which would audit clean): refused."""
    path, key, bad = found
    lines = path.read_bytes().splitlines(keepends=True)
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b"".join(line for line in lines if f'"position":{bad},'.encode() not in line))
    started = _forks(monkeypatch)
    with path.open("rb") as f:  # control: the same file, its audit reading the same bytes
        assert not verify_bundle(f, key).ok
    monkeypatch.setattr(bundle, "_reopen", lambda fd: clean.open("rb"))
    with path.open("rb") as f, pytest.raises(BundleError, match="changed while it was verified"):
        verify_bundle(f, key)
    assert len(started) == 2


def test_a_bundle_in_memory_or_a_small_one_is_audited_here(
    found: tuple[Path, NoteKey, int],
) -> None:
    path, _, _ = found
    assert bundle._SeparateAudit.start(io.BytesIO(path.read_bytes())) is None
    with path.open("rb") as f:  # smaller than PARALLEL_AUDIT_BYTES
        assert bundle._SeparateAudit.start(f) is None
