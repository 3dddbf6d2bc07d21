"""``export verify`` of a large whole-journal bundle (a regular file of at least
``PARALLEL_AUDIT_BYTES``) runs its semantic audit in a forked process beside the
checks: the same report as in one process (a finding included), whichever way its lines
give the states (embedded, in base64 for a state holding a newline, or a v3 bundle's),
and an audit that did not read the sealed bytes counts for nothing (the file changed
under it: refused, with the in-process verification of the same file as the control).
Both backends."""

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
from tests.audit._support import _Raw, as_v3, real_history, rehash_from


def _overdrawn(url: str, home: Path) -> tuple[str, int]:
    """A real history with one broken rule (a usage past its lease): (the journal's
    verifier key, the bad entry's position)."""
    from charter.budgets import UsageRecorded

    vkey, lineages = real_history(url, home)
    zero = Budget.parse("tokens=0,wall=0s,cpu=0s,mem=0KiB,egress=0KB")
    big = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB")
    with Journal.open(url) as j:
        (bad,) = j.append(
            [UsageRecorded(lineage=lineages[0], amount=big, refused=zero, exhausted=False)]
        )
    return vkey, bad.position


def _export_to(url: str, home: Path, path: Path) -> Path:
    with Journal.open(url) as j, path.open("wb") as f:
        export_bundle(j, KeyStore(home).load("journal"), f)
    return path


@pytest.fixture
def found(journal_url: str, tmp_path: Path) -> tuple[Path, NoteKey, int]:
    """A whole bundle (a file) of a real history with one broken rule: (its path, the
    journal key, the bad entry's position)."""
    home = tmp_path / "home"
    vkey, bad = _overdrawn(journal_url, home)
    return _export_to(journal_url, home, tmp_path / "bundle.jsonl"), NoteKey.parse(vkey), bad


@pytest.fixture
def newline(journal_url: str, tmp_path: Path) -> tuple[Path, NoteKey, int]:
    """As :func:`found`, the bad entry's stored state holding a newline byte (JSON
    whitespace before its last brace, the chain hashed again from it: written past
    Charter, which never writes one)."""
    home = tmp_path / "home"
    vkey, bad = _overdrawn(journal_url, home)
    with Journal.open(journal_url) as j:
        (stored,) = [r.state for r in j.rows() if r.position == bad]
    with _Raw(journal_url) as raw:
        raw.drop_guards()
        rehash_from(journal_url, raw, bad, stored[:-1] + b"\n}")
    return _export_to(journal_url, home, tmp_path / "bundle.jsonl"), NoteKey.parse(vkey), bad


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


def _both(path: Path, key: NoteKey, monkeypatch: pytest.MonkeyPatch) -> bundle.BundleReport:
    """The report of ``path`` audited in this process, which must be the one audited in
    the other process."""
    alone = verify_bundle(path.read_bytes(), key)
    with monkeypatch.context() as m:
        started = _forks(m)
        with path.open("rb") as f:
            beside = verify_bundle(f, key)
    assert started
    assert beside == alone
    return alone


def test_a_state_holding_a_newline_is_verified_and_audited_in_base64(
    newline: tuple[Path, NoteKey, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, key, bad = newline
    (line,) = [x for x in path.read_bytes().splitlines() if f'"position":{bad},'.encode() in x]
    assert b"state_base64" in line
    assert b',"state":' not in line
    report = _both(path, key, monkeypatch)
    assert [(f.check, f.position) for f in report.findings] == [("conservation", bad)]


def test_a_v3_bundle_is_verified_by_its_format(
    found: tuple[Path, NoteKey, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The format before (states in base64): the same report as the v4 bundle's, in
    one process or two; one bit of a state changed fails at its entry."""
    path, key, bad = found
    v4 = _both(path, key, monkeypatch)
    old = tmp_path / "v3.jsonl"
    old.write_bytes(as_v3(path.read_bytes(), KeyStore(tmp_path / "home").load("journal")))
    assert b'"format":"charter/bundle@v3"' in old.read_bytes()
    assert _both(old, key, monkeypatch) == v4
    lines = old.read_bytes().splitlines(keepends=True)
    i = next(i for i, x in enumerate(lines) if f'"position":{bad},'.encode() in x)
    lines[i] = lines[i].replace(b'"state":"eyJ', b'"state":"eyK', 1)
    with pytest.raises(BundleError) as caught:
        verify_bundle(b"".join(lines), key)
    assert caught.value.part == f"entry/{bad}"
