"""The streamed bundle and the streamed audit: what makes them stream.

- an entry's line (orjson) is byte for byte the canonical encoder's;
- the compact range and the gap hasher rebuild every tree an independent RFC 6962
  implementation builds, whatever runs of leaves are omitted;
- export's and verify's peak memory (tracemalloc) is the same for 20k and 50k entries;
- the audit gives a finding before it reads the next batch.
"""

from __future__ import annotations

import base64
import io
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from charter.audit import bundle, merkle
from charter.audit.bundle import entry_line, entry_lines, verify_bundle
from charter.audit.export import export_bundle
from charter.audit.semantic import Finding, audit_history
from charter.audit.tree import MerkleLog
from charter.core.events import canonical_json
from tests.audit import rfc6962
from tests.audit._support import fill_real, make_journal


@settings(max_examples=300, deadline=None)
@given(
    topic=st.text(),
    position=st.integers(min_value=1, max_value=2**63 - 1),
    version=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    state=st.binary(max_size=64) | st.sampled_from([b"\n", b'{"a":"\n"}', b"}\n}", b"{}"]),
    context=st.booleans(),
)
def test_an_entry_line_is_the_canonical_encoding(
    topic: str, position: int, version: int, state: bytes, context: bool
) -> None:
    """Its nine fields' canonical JSON, then ``,"state":`` and the state's bytes before
    the closing brace; a state holding a newline byte in base64 instead, as the tenth
    field ``state_base64`` of the canonical JSON (docs/VERIFYING.md §8). The exporter's
    loop over a batch (``entry_lines``) writes the same bytes."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in topic):
        return  # a lone surrogate is not encodable at all (docs/VERIFYING.md §1.1)
    fields = {
        "position": position,
        "originator": bytes(range(16)),
        "version": version,
        "topic": topic,
        "state": state,
        "prev_hash": bytes(32),
        "chain_hash": bytes(range(32)),
        "leaf": position - 1,
        "context": context,
    }
    expected: dict[str, object] = {
        **fields,
        "originator": bytes(range(16)).hex(),
        "prev_hash": bytes(32).hex(),
        "chain_hash": bytes(range(32)).hex(),
        "kind": "entry",
    }
    del expected["state"]
    if b"\n" in state:
        line = canonical_json({**expected, "state_base64": base64.b64encode(state).decode()})
        line += b"\n"
    else:
        line = canonical_json(expected)[:-1] + b',"state":' + state + b"}\n"
    assert entry_line(**fields) == line  # type: ignore[arg-type]
    if not context:
        row = (position, "x", version, topic, state, bytes(32), bytes(range(32)))
        joined, leaves = entry_lines([row], lambda _: bytes(range(16)), position - 1)
        assert joined == line
        assert len(leaves) == 1


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=80), st.lists(st.booleans(), max_size=80))
def test_omitted_runs_rebuild_every_tree(size: int, kept: list[bool]) -> None:
    leaves = [bytes([i % 256, i // 256]) for i in range(size)]
    hashes = [rfc6962.leaf(x) for x in leaves]
    tree = merkle.CompactRange()
    gap: merkle.GapHasher | None = None
    for i, h in enumerate(hashes):
        if i < len(kept) and kept[i]:
            if gap is not None:
                for (level, _), d in zip(
                    merkle.decompose(gap.start, gap.end), gap.hashes(), strict=True
                ):
                    tree.push(level, d)
                gap = None
            tree.push(0, h)
        else:
            gap = gap or merkle.GapHasher(i)
            gap.push(h)
    if gap is not None:
        for (level, _), d in zip(merkle.decompose(gap.start, gap.end), gap.hashes(), strict=True):
            tree.push(level, d)
    assert tree.size == size
    assert tree.root() == rfc6962.Naive(hashes).mth(0, size)


def _peaks(tmp_path: Path, batches: int) -> tuple[int, int, int]:
    """(bundle bytes, export's peak, verify's peak) of a whole journal of ``batches``
    thousand entries, by tracemalloc."""
    journal, key = make_journal(f"sqlite:///{tmp_path}/{batches}.db")
    with journal:
        fill_real(journal, batches, size=1000)
        MerkleLog(journal).catch_up()
        anchor = MerkleLog(journal).anchor_key()
        path = tmp_path / f"{batches}.jsonl"
        tracemalloc.start()
        try:
            with path.open("wb") as out:
                made = export_bundle(journal, key, out)
            _, export_peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            with path.open("rb") as f:
                report = verify_bundle(f, anchor)
            _, verify_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert made.entries == report.entries == batches * 1000
    assert report.ok
    return path.stat().st_size, export_peak, verify_peak


def test_export_and_verify_memory_does_not_grow_with_the_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2.5 times the entries, the same peaks: for the export, two journal batches of
    10,000 rows (the one folded and the one being fetched), so from 20,000 entries on;
    for the verifier, one block of lines and O(log n) hashes. Both audited in this
    process (where tracemalloc sees the audit's books; a large file's audit runs in a
    process of its own, tests/audit/test_bundle_parallel.py)."""
    monkeypatch.setattr(bundle, "PARALLEL_AUDIT_BYTES", 1 << 62)
    small = _peaks(tmp_path, 20)
    large = _peaks(tmp_path, 50)
    assert large[0] > 2.4 * small[0]  # control: the bundle did grow
    assert large[1] < 1.3 * small[1], (small, large)
    assert large[2] < 1.3 * small[2], (small, large)
    assert large[2] < 1 << 20 < large[0] / 20, large  # the verifier holds next to nothing


def test_the_audit_reports_a_finding_before_it_reads_the_next_batch() -> None:
    state = b'{"at":"2026-12-01T00:00:00.000000+00:00","payload":{}}'
    events: list[str] = []

    def batches():  # type: ignore[no-untyped-def]
        events.append("batch 1")
        yield [(1, "NoSuchType/v1", state)]
        events.append("batch 2")
        yield [(2, "SandboxProbeRefused/v1", state)]

    def found(f: Finding) -> None:
        events.append(f"finding {f.check} at {f.position}")

    report = audit_history(batches(), found)
    assert events == ["batch 1", "finding entry-type at 1", "batch 2"]
    assert [f.check for f in report.findings] == ["entry-type"]


def test_a_bundle_can_be_read_from_any_binary_stream(tmp_path: Path) -> None:
    journal, key = make_journal(f"sqlite:///{tmp_path}/j.db")
    with journal:
        fill_real(journal, 3, size=5)
        out = io.BytesIO()
        export_bundle(journal, key, out)
        anchor = MerkleLog(journal).anchor_key()
    assert verify_bundle(io.BytesIO(out.getvalue()), anchor).entries == 15
    assert verify_bundle(out.getvalue(), anchor).entries == 15
