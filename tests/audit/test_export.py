"""Export bundles of a real history (SQLite and PostgreSQL): an untouched bundle verifies
offline, a subtree's bundle proves its entries (and their grant chains) without the
rest, and each altered part fails at that part."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import charter.catalogue  # noqa: F401  (entries decodes every type)
from charter.audit.bundle import Bundle, canonical, verify_bundle
from charter.audit.errors import BundleError
from charter.audit.export import export_bundle, lineages_in, mentions
from charter.audit.note import NoteKey, SignedNote
from charter.audit.tree import MerkleLog
from charter.core import Budget, KeyStore
from charter.ledger import Journal
from tests.audit._support import real_history

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
    with Journal.open(url) as j:
        return export_bundle(j, KeyStore(home).load("journal"), **kw).to_bytes()


def test_a_whole_journal_bundle_verifies(history: tuple) -> None:
    url, home, key, _ = history
    data = _export(url, home)
    report = verify_bundle(data, key)
    with Journal.open(url) as j:
        assert report.entries == len(list(j.rows()))
    assert report.grant_chains == 6  # the root's ceiling and five workers
    assert report.audited
    assert report.ok


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
    bundle, _ = Bundle.parse(_export(url, home, lineage=worker))
    selected = [e for e in bundle.entries if not e.context]
    assert selected
    assert all(mentions(e.payload(), worker) for e in selected)
    # the context is the grant chains of the lineages the selection names, and the root's
    # registration (its trust root), nothing else
    named = {n for e in selected for n in lineages_in(e.payload())}
    chains = {a for n in named for a in (n, *_ancestors_of(n))}
    for e in bundle.entries:
        if e.context:
            assert e.type_name in ("GrantMinted", "AgentRegistered")
            assert e.payload()["lineage"] in chains
    # nothing of the other subtree's fan-out is revealed
    grandchild = lineages[3]
    assert not any(mentions(e.payload(), grandchild) for e in bundle.entries)
    report = verify_bundle(bundle.to_bytes(), key)
    assert report.grant_chains == len(
        {e.payload()["lineage"] for e in bundle.entries if e.type_name == "GrantMinted"}
    )
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
    with Journal.open(url) as j:
        data = export_bundle(
            j, KeyStore(home).load("journal"), checkpoint=SignedNote.parse(cosigned.render())
        ).to_bytes()
    assert verify_bundle(data, key, witness_keys=[wkey]).cosignatures == 1
    other = Witness(KeyStore(tmp_path / "w2")).init("witness.example/other")
    with pytest.raises(BundleError) as caught:
        verify_bundle(data, key, witness_keys=[other])
    assert caught.value.part == "checkpoint"


def _doc(data: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(data)
    return doc


def _remanifest(doc: dict[str, Any]) -> bytes:
    """What an attacker does after changing a part: recompute the (unsigned) manifest."""
    bundle, _ = Bundle.parse(canonical({**doc, "manifest": {}}))
    return bundle.to_bytes()


def _flip_b64(text: str) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[len(raw) // 2] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def _fails_at(data: bytes, key: NoteKey, part: str) -> None:
    with pytest.raises(BundleError) as caught:
        verify_bundle(data, key)
    assert caught.value.part == part, caught.value


def test_each_altered_part_fails_at_that_part(history: tuple) -> None:
    url, home, key, _ = history
    data = _export(url, home)
    verify_bundle(data, key)  # positive control
    doc = _doc(data)
    entry = doc["entries"][5]
    position = entry["position"]

    # an entry's byte, without and with the manifest recomputed
    changed = {**doc, "entries": [*doc["entries"]]}
    changed["entries"][5] = {**entry, "state": _flip_b64(entry["state"])}
    _fails_at(canonical(changed), key, f"manifest/entry/{position}")
    _fails_at(_remanifest(changed), key, f"entry/{position}")

    # a proof hash
    path = list(entry["path"])
    path[0] = ("0" if path[0][0] != "0" else "1") + path[0][1:]
    changed["entries"][5] = {**entry, "path": path}
    _fails_at(_remanifest(changed), key, f"entry/{position}/proof")

    # the checkpoint: a changed size line, or its signature
    note = doc["checkpoint"]
    lines = note.split("\n")
    lines[1] = str(int(lines[1]) + 1)
    _fails_at(_remanifest({**doc, "checkpoint": "\n".join(lines)}), key, "checkpoint")
    sig_line = note.rstrip("\n").split("\n")[-1]
    blob = sig_line.split(" ")[-1]
    forged = note.replace(blob, _flip_b64(blob))
    _fails_at(_remanifest({**doc, "checkpoint": forged}), key, "checkpoint")

    # the keys: a bundle naming another key, or verified with another key
    other = NoteKey.make(key.name, key.type, bytes(32)).text()
    _fails_at(_remanifest({**doc, "keys": [{"key": other, "from_position": 1}]}), key, "keys")
    _fails_at(data, NoteKey.make(key.name, key.type, bytes(range(32))), "keys")

    # the manifest itself, and an entry dropped from the bundle
    manifest = {**doc["manifest"], "selection": "00" * 32}
    _fails_at(canonical({**doc, "manifest": manifest}), key, "manifest/selection")
    dropped = {**doc, "entries": doc["entries"][:5] + doc["entries"][6:]}
    _fails_at(canonical(dropped), key, f"manifest/entry/{position}")

    # an entry's grant swapped for another's signature (chain check), manifest redone
    grants = [i for i, e in enumerate(doc["entries"]) if e["topic"].startswith("GrantMinted")]
    i = grants[-1]
    state = json.loads(base64.b64decode(doc["entries"][i]["state"]))
    state["payload"]["signature"] = "00" * 64
    from charter.core.framing import entry_hash  # the attacker also re-chains it

    e = doc["entries"][i]
    new_state = canonical(state)
    new_hash = entry_hash(
        bytes.fromhex(e["prev_hash"]),
        e["position"],
        bytes.fromhex(e["originator"]),
        e["version"],
        e["topic"].encode(),
        new_state,
    )
    resealed = {**e, "state": base64.b64encode(new_state).decode(), "chain_hash": new_hash.hex()}
    grant_doc = {**doc, "entries": [*doc["entries"]]}
    grant_doc["entries"][i] = resealed
    _fails_at(_remanifest(grant_doc), key, f"entry/{e['position']}/proof")


def test_export_verify_runs_offline_with_no_database_no_network_no_home(
    history: tuple, tmp_path: Path
) -> None:
    url, home, key, _ = history
    bundle = tmp_path / "bundle.json"
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
    doc = _doc(bundle.read_bytes())
    doc["entries"][0] = {**doc["entries"][0], "state": _flip_b64(doc["entries"][0]["state"])}
    bad = tmp_path / "bad.json"
    bad.write_bytes(_remanifest(doc))
    result = run(bad)
    assert result.returncode == 3, result.stderr
    assert f"entry/{doc['entries'][0]['position']}" in result.stderr


def test_a_committed_forged_grant_fails_at_its_grant_chain(history: tuple) -> None:
    """A forged grant appended past the control layer is in the tree, so its entry and
    proof verify; its chain does not."""
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


def _without(doc: dict[str, Any], position: int) -> bytes:
    """The attacker's cut: an entry and its manifest line gone, nothing else touched."""
    entries = [e for e in doc["entries"] if e["position"] != position]
    manifest = {k: v for k, v in doc["manifest"].items() if k != f"entry/{position}"}
    return canonical({**doc, "entries": entries, "manifest": manifest})


def test_a_dropped_entry_or_a_relabelled_selection_breaks_the_seal(history: tuple) -> None:
    """The manifest is signed (the seal): before, an entry dropped with its manifest line,
    or a selection relabelled with its manifest line recomputed, verified, every other
    entry still proving its inclusion."""
    url, home, key, lineages = history
    data = _export(url, home, start=5, stop=12)
    verify_bundle(data, key)  # positive control
    doc = _doc(data)
    middle = [e for e in doc["entries"] if not e["context"]][3]["position"]
    _fails_at(_without(doc, middle), key, "seal")
    relabelled = {**doc, "selection": {"from": 5, "lineage": None, "to": 30}}
    manifest = {
        **doc["manifest"],
        "selection": hashlib.sha256(canonical(relabelled["selection"])).hexdigest(),
    }
    _fails_at(canonical({**relabelled, "manifest": manifest}), key, "seal")
    subtree = _doc(_export(url, home, lineage=lineages[1]))
    verify_bundle(canonical(subtree), key)  # positive control
    other = {**subtree, "selection": {**subtree["selection"], "lineage": lineages[2]}}
    _fails_at(_remanifest(other), key, "seal")
    unsealed = {**doc, "seal": ""}
    _fails_at(canonical(unsealed), key, "seal")
