"""Export bundles of a real history (SQLite and PostgreSQL): an untouched bundle verifies
offline, a subtree's bundle proves its entries (and their grant chains) without the
rest, and each altered part fails at that part."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import charter.catalogue  # noqa: F401  (entries decodes every type)
from charter.audit import merkle
from charter.audit.bundle import BundleEntry, verify_bundle
from charter.audit.errors import BundleError
from charter.audit.export import export_bundle, lineages_in, mentions
from charter.audit.note import NoteKey, SignedNote
from charter.audit.tree import MerkleLog
from charter.core import Budget, KeyStore
from charter.core.events import canonical_json
from charter.core.framing import entry_frame, merkle_leaf_hash, merkle_node_hash
from charter.ledger import Journal
from tests.audit._support import bundle_lines as _lines
from tests.audit._support import flip_b64, real_history, rechain_lines
from tests.audit._support import join_lines as _join

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def history(journal_url: str, tmp_path: Path) -> tuple[str, Path, NoteKey, list[str]]:
    home = tmp_path / "home"
    vkey, lineages = real_history(journal_url, home)
    return journal_url, home, NoteKey.parse(vkey), lineages


def _ancestors_of(lineage: str) -> list[str]:
    parts = lineage.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _export(url: str, home: Path, **kw: Any) -> bytes:
    out = io.BytesIO()
    with Journal.open(url) as j:
        export_bundle(j, KeyStore(home).load("journal"), out, **kw)
    return out.getvalue()


def _entries(lines: list[dict[str, Any]]) -> list[BundleEntry]:
    return [_entry(line) for line in lines if line["kind"] == "entry"]


def _entry(line: dict[str, Any]) -> BundleEntry:
    return BundleEntry(
        position=line["position"],
        originator=bytes.fromhex(line["originator"]),
        version=line["version"],
        topic=line["topic"],
        state=base64.b64decode(line["state"]),
        prev_hash=bytes.fromhex(line["prev_hash"]),
        chain_hash=line["chain_hash"],
        leaf=line["leaf"],
        context=line["context"],
    )


def test_a_whole_journal_bundle_verifies(history: tuple) -> None:
    url, home, key, _ = history
    data = _export(url, home)
    report = verify_bundle(data, key)
    with Journal.open(url) as j:
        assert report.entries == len(list(j.rows()))
    assert report.grant_chains == 6  # the root's ceiling and five workers
    assert report.gaps == 0
    assert report.audited
    assert report.ok
    lines = _lines(data)
    assert [line["kind"] for line in (lines[0], lines[-1])] == ["header", "seal"]
    assert [e.leaf for e in _entries(lines)] == list(range(report.checkpoint_size))


def test_a_whole_bundle_is_audited_and_a_broken_rule_is_a_finding(history: tuple) -> None:
    from charter.budgets import UsageRecorded

    url, home, key, lineages = history
    zero = Budget.parse("tokens=0,wall=0s,cpu=0s,mem=0KiB,egress=0KB")
    big = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB")
    with Journal.open(url) as j:
        (bad,) = j.append(
            [UsageRecorded(lineage=lineages[0], amount=big, refused=zero, exhausted=False)]
        )
    report = verify_bundle(_export(url, home), key)
    assert not report.ok
    assert [(f.check, f.position) for f in report.findings] == [("conservation", bad.position)]
    partial = verify_bundle(_export(url, home, start=1, stop=bad.position), key)
    assert not partial.audited  # a partial bundle lacks the history budgets need


def test_a_subtree_bundle_holds_only_its_entries_and_proves_them(history: tuple) -> None:
    url, home, key, lineages = history
    worker = lineages[2]  # agent:estate/sa-3: no children
    data = _export(url, home, lineage=worker)
    entries = _entries(_lines(data))
    selected = [e for e in entries if not e.context]
    assert selected
    assert all(mentions(e.payload(), worker) for e in selected)
    # the context is the grant chains of the lineages the selection names, and the root's
    # registration (its trust root), nothing else
    named = {n for e in selected for n in lineages_in(e.payload())}
    chains = {a for n in named for a in (n, *_ancestors_of(n))}
    for e in entries:
        if e.context:
            assert e.type_name in ("GrantMinted", "AgentRegistered")
            assert e.payload()["lineage"] in chains
    # nothing of the other subtree's fan-out is revealed
    grandchild = lineages[3]
    assert not any(mentions(e.payload(), grandchild) for e in entries)
    report = verify_bundle(data, key)
    assert report.grant_chains == len(
        {e.payload()["lineage"] for e in entries if e.type_name == "GrantMinted"}
    )
    assert report.gaps > 0
    with Journal.open(url) as j:
        size = MerkleLog(j).size()
    assert report.checkpoint_size == size  # proved against the whole log


def test_a_cosigned_checkpoint_can_be_used_and_its_witness_required(
    history: tuple, tmp_path: Path
) -> None:
    from charter.audit.witness import Witness

    url, home, key, _ = history
    with Journal.open(url) as j:
        log = MerkleLog(j)
        note = log.checkpoint(KeyStore(home).load("journal"))
    witness = Witness(KeyStore(tmp_path / "w"))
    wkey = witness.init("witness.example/w")
    cosigned = witness.cosign(note, key, None)
    data = _export(url, home, checkpoint=SignedNote.parse(cosigned.render()))
    assert verify_bundle(data, key, witness_keys=[wkey]).cosignatures == 1
    other = Witness(KeyStore(tmp_path / "w2")).init("witness.example/other")
    with pytest.raises(BundleError) as caught:
        verify_bundle(data, key, witness_keys=[other])
    assert caught.value.part == "checkpoint"


def _fails_at(data: bytes, key: NoteKey, part: str) -> BundleError:
    with pytest.raises(BundleError) as caught:
        verify_bundle(data, key)
    assert caught.value.part == part, caught.value
    return caught.value


def test_each_altered_part_fails_at_that_part(history: tuple) -> None:
    url, home, key, _ = history
    data = _export(url, home)
    verify_bundle(data, key)  # positive control
    lines = _lines(data)
    assert _join(lines) == data  # the attacker's re-encoding is the exporter's
    entry = lines[6]
    position = entry["position"]

    # an entry's byte; then re-chained from it (the next entry no longer links), then
    # every later entry re-chained too (the tree's root differs)
    changed = [*lines]
    changed[6] = {**entry, "state": flip_b64(entry["state"])}
    _fails_at(_join(changed), key, f"entry/{position}")
    state = base64.b64decode(entry["state"]).replace(b'"at":"', b'"at":"1', 1)
    relinked = [*lines]
    relinked[6] = rechain_lines(lines, 6, state)[6]
    _fails_at(_join(relinked), key, f"entry/{lines[7]['position']}")
    _fails_at(_join(rechain_lines(lines, 6, state)), key, "tree")

    # the checkpoint: a changed size line, or its signature
    header = lines[0]
    note = header["checkpoint"]
    parts = note.split("\n")
    parts[1] = str(int(parts[1]) + 1)
    _fails_at(_join([{**header, "checkpoint": "\n".join(parts)}, *lines[1:]]), key, "checkpoint")
    blob = note.rstrip("\n").split("\n")[-1].split(" ")[-1]
    forged = note.replace(blob, flip_b64(blob))
    _fails_at(_join([{**header, "checkpoint": forged}, *lines[1:]]), key, "checkpoint")

    # the keys: a bundle naming another key, or verified with another key
    other = NoteKey.make(key.name, key.type, bytes(32)).text()
    wrong_keys = {**header, "keys": [{"after_leaf": -1, "key": other}]}
    _fails_at(_join([wrong_keys, *lines[1:]]), key, "keys")
    _fails_at(data, NoteKey.make(key.name, key.type, bytes(range(32))), "keys")

    # an entry dropped, two swapped, one added twice: its leaf is not the next one
    _fails_at(_join(lines[:6] + lines[7:]), key, f"entry/{lines[7]['position']}")
    _fails_at(
        _join([*lines[:6], lines[7], lines[6], *lines[8:]]), key, f"entry/{lines[7]['position']}"
    )
    _fails_at(_join([*lines[:7], lines[6], *lines[7:]]), key, f"entry/{position}")
    # a line made non-canonical (its object reads the same, its bytes differ): sealed;
    # a header made non-canonical is refused as it is read
    spaced = data.replace(b'{"chain_hash":', b'{ "chain_hash":', 1)
    _fails_at(spaced, key, "seal")
    _fails_at(data.replace(b'{"checkpoint":', b'{ "checkpoint":', 1), key, "format")
    # the trailer: gone, or its seal changed, or a line after it
    _fails_at(_join(lines[:-1]), key, "seal")
    trailer = lines[-1]
    _fails_at(_join([*lines[:-1], {**trailer, "seal": flip_b64(trailer["seal"])}]), key, "seal")
    _fails_at(data + data.splitlines(keepends=True)[1], key, "seal")

    # a grant's signature swapped for zeros, re-chained to the end: its grant chain
    # fails as it is read (the tree's root would too, at the end)
    grants = [i for i, e in enumerate(lines) if e.get("topic", "").startswith("GrantMinted")]
    i = grants[-1]
    doc = json.loads(base64.b64decode(lines[i]["state"]))
    doc["payload"]["signature"] = "00" * 64
    forged = _join(rechain_lines(lines, i, canonical_json(doc)))
    _fails_at(forged, key, f"grants/{doc['payload']['lineage']}")


def test_an_earlier_format_is_refused_with_a_clear_message(history: tuple) -> None:
    url, home, key, _ = history
    data = _export(url, home)
    verify_bundle(data, key)  # positive control
    v2 = canonical_json({"checkpoint": "x", "entries": [], "format": "charter/bundle@v2"})
    error = _fails_at(v2, key, "format")
    assert "earlier bundle format" in str(error)
    _fails_at(b"", key, "format")
    header = _lines(data)[0]
    _fails_at(_join([{**header, "format": "charter/bundle@v2"}]), key, "format")


def test_export_verify_runs_offline_with_no_database_no_network_no_home(
    history: tuple, tmp_path: Path
) -> None:
    url, home, key, _ = history
    bundle = tmp_path / "bundle.jsonl"
    bundle.write_bytes(_export(url, home))
    if url.startswith("sqlite"):
        Path(url[len("sqlite:///") :]).unlink()  # the database is gone
    unshare = shutil.which("unshare")
    prefix = [unshare, "--net"] if unshare and os.geteuid() == 0 else []

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *prefix,
                sys.executable,
                "-m",
                "charter",
                "--json",
                "export",
                "verify",
                str(path),
                "--journal-key",
                key.text(),
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            check=False,
            env={
                "PYTHONPATH": str(ROOT),
                "CHARTER_HOME": str(tmp_path / "none"),
                "CHARTER_DB": "postgresql://nobody@127.0.0.1:1/none",
            },
        )

    result = run(bundle)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ok"] is True
    assert not (tmp_path / "none").exists()
    if prefix:  # the network namespace really was empty: a connection there fails
        net = subprocess.run(
            [*prefix, "cat", "/proc/net/dev"], capture_output=True, text=True, check=True
        )
        assert "eth" not in net.stdout
    lines = _lines(bundle.read_bytes())
    lines[1] = {**lines[1], "state": flip_b64(lines[1]["state"])}
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(_join(lines))
    result = run(bad)
    assert result.returncode == 3, result.stderr
    assert f"entry/{lines[1]['position']}" in result.stderr


def test_a_committed_forged_grant_fails_at_its_grant_chain(history: tuple) -> None:
    """A forged grant appended past the control layer is in the tree, so its entry and
    the tree verify; its chain does not."""
    url, home, key, lineages = history
    verify_bundle(_export(url, home), key)  # positive control
    with Journal.open(url) as j:
        real = next(
            e.event for e in j.entries(types=["GrantMinted"]) if e.event.lineage == lineages[2]
        )
        j.append([real.model_copy(update={"signature": "00" * 64, "fanout": "f-forged"})])
    with pytest.raises(BundleError) as caught:
        verify_bundle(_export(url, home), key)
    assert caught.value.part == f"grants/{lineages[2]}"


def _hidden(lines: list[dict[str, Any]], position: int) -> bytes:
    """The attacker's cut of a partial bundle: the entry at ``position`` folded into the
    gaps around it, with the right hashes (its frame is in the bundle), so the tree's
    root is rebuilt exactly; nothing else touched."""
    out: list[dict[str, Any]] = []
    hashes: dict[int, bytes] = {}  # leaf → leaf hash, for the leaves now omitted
    for line in lines[1:-1]:
        if line["kind"] == "entry" and line["position"] != position:
            out.append(line)
            continue
        if line["kind"] == "entry":
            e = _entry(line)
            frame = entry_frame(
                e.prev_hash, e.position, e.originator, e.version, e.topic.encode(), e.state
            )
            hashes[e.leaf] = merkle_leaf_hash(frame)
            block = {
                "kind": "gap",
                "start": e.leaf,
                "end": e.leaf + 1,
                "nodes": [(0, hashes[e.leaf])],
            }
        else:
            nodes = list(
                zip(
                    [k[0] for k in merkle.decompose(line["start"], line["end"])],
                    [bytes.fromhex(h) for h in line["hashes"]],
                    strict=True,
                )
            )
            block = {"kind": "gap", "start": line["start"], "end": line["end"], "nodes": nodes}
        if out and out[-1]["kind"] == "gap":
            out[-1] = {**out[-1], "end": block["end"], "nodes": out[-1]["nodes"] + block["nodes"]}
        else:
            out.append(block)
    rebuilt: list[dict[str, Any]] = []
    for line in out:
        if line["kind"] != "gap":
            rebuilt.append(line)
            continue
        # the merged run's blocks, merged where two are siblings (RFC 6962 nodes)
        stack: list[tuple[int, int, bytes]] = []
        index_at = line["start"]
        for level, digest in line["nodes"]:
            stack.append((level, index_at >> level, digest))
            index_at += 1 << level
            while (
                len(stack) > 1
                and stack[-1][0] == stack[-2][0]
                and stack[-2][1] % 2 == 0
                and stack[-2][1] + 1 == stack[-1][1]
            ):
                (lv, ix, right), (_, _, left) = stack.pop(), stack.pop()
                stack.append((lv + 1, ix >> 1, merkle_node_hash(left, right)))
        rebuilt.append(
            {
                "end": line["end"],
                "hashes": [d.hex() for _, _, d in stack],
                "kind": "gap",
                "start": line["start"],
            }
        )
    return _join([lines[0], *rebuilt, lines[-1]])


def test_a_hidden_entry_or_a_relabelled_selection_breaks_the_seal(history: tuple) -> None:
    """Every line is sealed: before (v2), an entry dropped with its manifest line, or a
    selection relabelled with its manifest line recomputed, verified. Now an entry folded
    into a gap with the right hashes rebuilds the tree exactly, and fails only at the
    seal; a relabelled selection fails at the seal too."""
    url, home, key, lineages = history
    data = _export(url, home, start=5, stop=12)
    verify_bundle(data, key)  # positive control
    lines = _lines(data)
    middle = [e for e in lines if e["kind"] == "entry" and not e["context"]][3]["position"]
    _fails_at(_hidden(lines, middle), key, "seal")
    relabelled = {**lines[0], "selection": {"from": 5, "lineage": None, "to": 30}}
    _fails_at(_join([relabelled, *lines[1:]]), key, "seal")
    # relabelled as the whole journal: its gaps show it is not
    whole = {**lines[0], "selection": {"from": None, "lineage": None, "to": None}}
    _fails_at(_join([whole, *lines[1:]]), key, "selection")
    subtree = _lines(_export(url, home, lineage=lineages[1]))
    verify_bundle(_join(subtree), key)  # positive control
    other = {**subtree[0], "selection": {**subtree[0]["selection"], "lineage": lineages[2]}}
    _fails_at(_join([other, *subtree[1:]]), key, "selection")  # it names entries of another


def test_a_whole_bundle_relabelled_to_skip_its_audit_fails(history: tuple) -> None:
    """The issue's attack: a failing whole-journal bundle relabelled `from=1,to=N` went
    from exit 3 to 0 (the audit switched off). Now the selection is sealed."""
    from charter.budgets import UsageRecorded

    url, home, key, lineages = history
    zero = Budget.parse("tokens=0,wall=0s,cpu=0s,mem=0KiB,egress=0KB")
    big = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB")
    with Journal.open(url) as j:
        j.append([UsageRecorded(lineage=lineages[0], amount=big, refused=zero, exhausted=False)])
    data = _export(url, home)
    assert not verify_bundle(data, key).ok  # positive control: the audit finds it
    lines = _lines(data)
    last = max(e["position"] for e in lines if e["kind"] == "entry")
    relabelled = {**lines[0], "selection": {"from": 1, "lineage": None, "to": last}}
    _fails_at(_join([relabelled, *lines[1:]]), key, "seal")
    # and a whole bundle that lost an entry (with the right gap) fails at its selection
    whole = _lines(_hidden(lines, lines[5]["position"]))
    _fails_at(_join(whole), key, "selection")


def test_a_write_that_fails_fails_the_export(history: tuple) -> None:
    """The bundle is written in a thread of its own: what the file's write raises is
    raised by the export, not lost in that thread."""
    url, home, _, _ = history

    class Full(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            raise OSError(28, "No space left on device")

    with Journal.open(url) as j, pytest.raises(OSError, match="No space left"):
        export_bundle(j, KeyStore(home).load("journal"), Full())  # type: ignore[arg-type]
