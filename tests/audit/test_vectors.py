"""The known-answer vectors in docs/vectors, checked three ways: the generator writes
the same bytes again (deterministic), Charter's verifier gives each file's stated
result, and so does a naive verifier written here from docs/VERIFYING.md alone.

The naive verifier imports nothing of Charter: hashlib, struct, base64, json,
Ed25519 (PyNaCl) and the suite's own RFC 6962 tree (tests/audit/rfc6962.py) only. It
is deliberately plain (whole files in memory, recursive Merkle roots) and follows §8's
order of checks, so a failing bundle fails at the same part. It does not re-implement
the semantic audit (§9) or the grant terms' attenuation (§6): the vectors' untouched
bundles have no findings, and their broken ones break what it does check.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from charter.audit.bundle import verify_bundle
from charter.audit.errors import BundleError
from charter.audit.note import NoteKey
from charter.core.events import canonical_json
from tests.audit import rfc6962

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "docs" / "vectors"


# -- the naive implementation, from docs/VERIFYING.md ------------------------------------


def enc(v: Any) -> bytes:
    """§1.1, written out."""
    return _enc(v).encode("utf-8")


_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _enc(v: Any) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        out = []
        for c in v:
            if c in _SHORT:
                out.append(_SHORT[c])
            elif ord(c) < 0x20:
                out.append(f"\\u{ord(c):04x}")
            else:
                out.append(c)
        return '"' + "".join(out) + '"'
    if isinstance(v, list):
        return "[" + ",".join(_enc(x) for x in v) + "]"
    items = sorted(v.items(), key=lambda kv: [ord(c) for c in kv[0]])
    return "{" + ",".join(_enc(k) + ":" + _enc(x) for k, x in items) + "}"


def frame(prev: bytes, pos: int, orig: bytes, ver: int, topic: bytes, state: bytes) -> bytes:
    return (
        b"charter/entry/v1\x00"
        + prev
        + struct.pack(">Q", pos)
        + struct.pack(">H", len(orig))
        + orig
        + struct.pack(">q", ver)
        + struct.pack(">I", len(topic))
        + topic
        + struct.pack(">I", len(state))
        + state
    )


# SHA-256, the RFC 6962 leaf and node hashes and MTH: the suite's own independent tree
sha, leaf, node = rfc6962.h, rfc6962.leaf, rfc6962.node


def mth(leaves: list[bytes]) -> bytes:
    return rfc6962.Naive(leaves).mth(0, len(leaves))


def decompose(start: int, end: int) -> list[int]:
    """The levels of the fewest aligned perfect subtrees of [start, end)."""
    out, s = [], start
    while s < end:
        level = 0
        while (s % (2 ** (level + 1)) == 0) and s + 2 ** (level + 1) <= end:
            level += 1
        out.append(level)
        s += 2**level
    return out


def parse_vkey(text: str) -> tuple[str, bytes]:
    name, key_id, b64 = text.split("+", 2)
    raw = base64.b64decode(b64)
    assert len(raw) == 33
    assert raw[0] == 1
    assert sha(name.encode() + b"\n" + raw).hex()[:8] == key_id
    return name, raw[1:]


def verify_note(note: str, vkey: str) -> tuple[int, bytes]:
    """§4: (size, root), or raise."""
    name, pub = parse_vkey(vkey)
    text, _, sigs = note.rpartition("\n\n")
    text += "\n"
    key_id = sha(name.encode() + b"\n\x01" + pub)[:4]
    found = False
    for line in sigs.splitlines():
        who, blob = line[len("— ") :].split(" ")
        raw = base64.b64decode(blob)
        if who == name and raw[:4] == key_id:
            VerifyKey(pub).verify(text.encode(), raw[4:])
            found = True
    lines = text.split("\n")
    if not found or lines[0] != name:
        raise ValueError("not signed by the key")
    return int(lines[1]), base64.b64decode(lines[2])


def rotation_input(origin: str, old: bytes, new: bytes) -> bytes:
    raw = origin.encode()
    return b"charter/journal-key-rotation/v1\x00" + struct.pack(">H", len(raw)) + raw + old + new


def grant_digest(body: bytes, signature: bytes) -> str:
    return sha(
        b"charter/grant-digest/v1\x00" + struct.pack(">I", len(body)) + body + signature
    ).hex()


def names(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, dict):
        return [s for x in v.values() for s in names(x)]
    if isinstance(v, list):
        return [s for x in v for s in names(x)]
    return []


class NaiveError(Exception):
    def __init__(self, part: str) -> None:
        super().__init__(part)
        self.part = part


def naive_verify(data: bytes, anchor: str) -> None:
    """§8, in its order; raises NaiveError(part)."""
    lines = data.split(b"\n")
    if lines[-1] != b"" or len(lines) < 2:
        raise NaiveError("format")
    lines = lines[:-1]
    try:
        header = json.loads(lines[0])
        assert enc(header) == lines[0]
        assert header["format"] in ("charter/bundle@v4", "charter/bundle@v3")
        assert header["kind"] == "header"
        assert set(header) == {"checkpoint", "format", "keys", "kind", "selection"}
    except (ValueError, AssertionError, KeyError, TypeError) as e:
        raise NaiveError("format") from e
    sel = header["selection"]
    if not isinstance(sel, dict) or set(sel) != {"from", "lineage", "to"}:
        raise NaiveError("selection")
    whole = sel == {"from": None, "lineage": None, "to": None}
    keys = header["keys"]
    if keys[0] != {"after_leaf": -1, "key": anchor}:
        raise NaiveError("keys")
    claims = [(k["after_leaf"], k["key"]) for k in keys[1:]]
    try:
        size = int(header["checkpoint"].split("\n")[1])
        signer = anchor
        for after, k in claims:
            if after < size:
                signer = k
        size, root = verify_note(header["checkpoint"], signer)
    except (ValueError, AssertionError, BadSignatureError, IndexError) as e:
        raise NaiveError("checkpoint") from e
    current = parse_vkey(anchor)[1]
    origin = parse_vkey(anchor)[0]
    used_claims = 0
    leaves: list[bytes] = []  # the tree's leaf hashes, or None-free stand-ins for gaps
    blocks: list[tuple[int, bytes]] = []  # (level, hash) in order
    sealed = hashlib.sha256(lines[0] + b"\n")
    last_chain: str | None = None
    last_pos, gap_before = 0, False
    roots: dict[str, bytes] = {}
    chains: dict[str, tuple[bytes, str]] = {}  # lineage -> (subject key, digest)
    trailer = None
    counts = {"entries": 0, "context": 0, "gaps": 0}
    v4 = header["format"] == "charter/bundle@v4"
    for i, raw in enumerate(lines[1:], start=1):
        state: bytes | None = None
        try:
            if v4 and b',"state":' in raw:  # an entry, its state's bytes embedded
                head, _, rest = raw.partition(b',"state":')
                assert rest.endswith(b"}")
                obj, state = json.loads(head + b"}"), rest[:-1]
                assert obj["kind"] == "entry"
            else:
                obj = json.loads(raw)
                if obj.get("kind") == "entry":
                    text = obj.pop("state_base64" if v4 else "state")
                    state = base64.b64decode(text, validate=True)
        except (ValueError, AssertionError, KeyError) as e:
            raise NaiveError(f"leaf/{sum(2**lv for lv, _ in blocks)}") from e
        if obj.get("kind") == "seal":
            trailer = obj
            if i != len(lines) - 1:
                raise NaiveError("seal")
            break
        sealed.update(raw + b"\n")
        at = sum(2**lv for lv, _ in blocks)
        if obj["kind"] == "gap":
            if whole:
                raise NaiveError("selection")
            if gap_before or obj["start"] != at or not obj["start"] < obj["end"] <= size:
                raise NaiveError(f"gap/{obj['start']}")
            levels = decompose(obj["start"], obj["end"])
            if len(levels) != len(obj["hashes"]):
                raise NaiveError(f"gap/{obj['start']}")
            blocks += [(lv, bytes.fromhex(h)) for lv, h in zip(levels, obj["hashes"], strict=True)]
            counts["gaps"] += 1
            last_chain, gap_before = None, True
            continue
        pos = obj["position"]
        where = f"entry/{pos}"
        if state is None or set(obj) != {
            "chain_hash", "context", "kind", "leaf", "originator", "position", "prev_hash",
            "topic", "version",
        }:  # fmt: skip
            raise NaiveError(where)
        f = frame(
            bytes.fromhex(obj["prev_hash"]),
            pos,
            bytes.fromhex(obj["originator"]),
            obj["version"],
            obj["topic"].encode(),
            state,
        )
        if obj["leaf"] != at or obj["leaf"] >= size:
            raise NaiveError(where)
        if sha(f).hex() != obj["chain_hash"]:
            raise NaiveError(where)
        if last_chain is not None and obj["prev_hash"] != last_chain:
            raise NaiveError(where)
        if pos <= last_pos:
            raise NaiveError(where)
        blocks.append((0, leaf(f)))
        leaves.append(leaf(f))
        kind = obj["topic"].split("/")[0]
        payload = json.loads(state)["payload"]
        if whole and obj["context"]:
            raise NaiveError(where)
        if not whole:
            if obj["context"]:
                if kind not in ("GrantMinted", "AgentRegistered", "JournalKeyRotated"):
                    raise NaiveError(where)
            else:
                if (sel["from"] is not None and pos < sel["from"]) or (
                    sel["to"] is not None and pos > sel["to"]
                ):
                    raise NaiveError("selection")
                lin = sel["lineage"]
                if lin is not None and not any(
                    s == lin or s.startswith(lin + "/") for s in names(payload)
                ):
                    raise NaiveError("selection")
        if kind == "JournalKeyRotated":
            old, new = bytes.fromhex(payload["old_key"]), bytes.fromhex(payload["new_key"])
            msg = rotation_input(payload["origin"], old, new)
            try:
                assert payload["origin"] == origin
                assert old == current
                VerifyKey(old).verify(msg, bytes.fromhex(payload["old_signature"]))
                VerifyKey(new).verify(msg, bytes.fromhex(payload["new_signature"]))
                valid = True
            except (AssertionError, BadSignatureError, ValueError):
                valid = False
            claimed = claims[used_claims] if used_claims < len(claims) else None
            if claimed is not None and claimed[0] == obj["leaf"]:
                if not valid or parse_vkey(claimed[1])[1] != new:
                    raise NaiveError("keys")
                current, used_claims = new, used_claims + 1
            elif valid:
                raise NaiveError("keys")
        elif kind == "AgentRegistered":
            roots.setdefault(payload["lineage"], bytes.fromhex(payload["trust_root"]))
        elif kind == "GrantMinted":
            body, sig = payload["body"].encode(), bytes.fromhex(payload["signature"])
            grant = json.loads(body)
            lineage = grant["lineage"]
            if grant["issuer"] == lineage:
                signer_key = roots.get(lineage)
                ok = signer_key is not None and grant["subject_key"] == signer_key.hex()
            else:
                parent = chains.get(grant["issuer"])
                signer_key = parent[0] if parent else None
                ok = parent is not None and grant["parent_digest"] == parent[1]
            try:
                assert ok
                assert signer_key is not None
                VerifyKey(signer_key).verify(b"charter/grant/v1\x00" + body, sig)
            except (AssertionError, BadSignatureError) as e:
                raise NaiveError(f"grants/{lineage}") from e
            chains.setdefault(
                lineage, (bytes.fromhex(grant["subject_key"]), grant_digest(body, sig))
            )
        counts["context" if obj["context"] else "entries"] += 1
        last_chain, last_pos, gap_before = obj["chain_hash"], pos, False
    covered = sum(2**lv for lv, _ in blocks)
    rebuilt = None
    if covered == size:
        stack: list[tuple[int, bytes]] = []
        for lv, h in blocks:
            stack.append((lv, h))
            while len(stack) > 1 and stack[-1][0] == stack[-2][0]:
                (lv2, r), (_, left) = stack.pop(), stack.pop()
                stack.append((lv2 + 1, node(left, r)))
        rebuilt = stack[-1][1] if stack else sha(b"")
        for _, left in reversed(stack[:-1]):
            rebuilt = node(left, rebuilt)
    if rebuilt != root:
        raise NaiveError("tree")
    if used_claims != len(claims):
        raise NaiveError("keys")
    key = parse_vkey(anchor)[1]
    for after, k in claims:
        if after < size:
            key = parse_vkey(k)[1]
    if trailer is None or {k: trailer.get(k) for k in counts} != counts:
        raise NaiveError("seal")
    try:
        VerifyKey(key).verify(
            b"charter/bundle-seal/v2\x00" + sealed.digest(), base64.b64decode(trailer["seal"])
        )
    except BadSignatureError as e:
        raise NaiveError("seal") from e


# -- the tests ---------------------------------------------------------------------------


def _cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((VECTORS / "bundles.json").read_text())["cases"]
    return cases


def test_the_generator_writes_the_same_bytes_again() -> None:
    result = subprocess.run(
        [sys.executable, str(VECTORS / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c['file']}@{c['key'][:24]}")
def test_each_bundle_gives_its_stated_result_by_both_verifiers(case: dict[str, Any]) -> None:
    data = (VECTORS / case["file"]).read_bytes()
    try:
        report = verify_bundle(data, NoteKey.parse(case["key"]))
        charter_says = "ok" if report.ok else "findings"
    except BundleError as e:
        charter_says = e.part
    try:
        naive_verify(data, case["key"])
        naive_says = "ok"
    except NaiveError as e:
        naive_says = e.part
    assert (charter_says, naive_says) == (case["expect"], case["expect"]), case["what"]


def test_the_journal_rows_hash_chain_and_roots_by_the_naive_code() -> None:
    doc = json.loads((VECTORS / "journal.json").read_text())
    prev = bytes(32)
    leaves = []
    for row in doc["entries"]:
        state = base64.b64decode(row["state"])
        assert state.decode() == row["state_text"]
        assert enc(json.loads(state)) == state  # the state is canonical JSON (§1.1)
        f = frame(
            prev,
            row["position"],
            bytes.fromhex(row["originator"]),
            row["version"],
            row["topic"].encode(),
            state,
        )
        assert (f.hex(), sha(f).hex(), row["prev_hash"]) == (
            row["frame"],
            row["chain_hash"],
            prev.hex(),
        )
        assert leaf(f).hex() == row["leaf_hash"]
        leaves.append(leaf(f))
        prev = sha(f)
    for n, root in doc["roots"].items():
        assert mth(leaves[: int(n)]).hex() == root
    r = doc["rotation"]
    payload = json.loads(doc["entries"][r["leaf"]]["state_text"])["payload"]
    built = rotation_input(
        payload["origin"], bytes.fromhex(payload["old_key"]), bytes.fromhex(payload["new_key"])
    )
    assert built.hex() == r["signing_input"]
    VerifyKey(bytes.fromhex(payload["old_key"])).verify(
        built, bytes.fromhex(payload["old_signature"])
    )
    assert parse_vkey(doc["rotated_key"])[1].hex() == payload["new_key"]


def test_the_checkpoints_and_proofs_verify_by_the_naive_code() -> None:
    doc = json.loads((VECTORS / "journal.json").read_text())
    size, before = len(doc["entries"]), doc["rotation"]["leaf"]
    # the tree up to the rotation is the anchor's; the whole tree the rotated key's
    assert (
        verify_note((VECTORS / f"checkpoint-{before}.txt").read_text(), doc["anchor_key"])[1].hex()
        == doc["roots"][str(before)]
    )
    assert (
        verify_note((VECTORS / f"checkpoint-{size}.txt").read_text(), doc["rotated_key"])[1].hex()
        == doc["roots"][str(size)]
    )
    with pytest.raises(ValueError):
        verify_note((VECTORS / f"checkpoint-{size}.txt").read_text(), doc["anchor_key"])
    # the tlog-proof (§7): RFC 9162 inclusion, written out
    text = (VECTORS / "inclusion-3.txt").read_text()
    head, _, note = text.partition("\n\n")
    lines = head.split("\n")
    assert lines[0] == "c2sp.org/tlog-proof@v1"
    f = base64.b64decode(lines[1].removeprefix("extra "))
    index = int(lines[2].removeprefix("index "))
    path = [base64.b64decode(x) for x in lines[3:]]
    n, root = verify_note(note, doc["rotated_key"])
    fn, sn, x = index, n - 1, leaf(f)
    for p in path:
        assert sn != 0
        if fn % 2 == 1 or fn == sn:
            x = node(p, x)
            if fn % 2 == 0:
                while fn % 2 == 0 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            x = node(x, p)
        fn, sn = fn >> 1, sn >> 1
    assert (sn, x) == (0, root)
    # the consistency proof (§7): RFC 9162 §2.1.4.2, written out
    c = (VECTORS / f"consistency-{before}-{size}.txt").read_text().strip().split("\n")
    assert c[:3] == ["charter/consistency-proof@v1", f"old {before}", f"new {size}"]
    proof = [base64.b64decode(h) for h in c[3:]]
    r1, r2 = bytes.fromhex(doc["roots"][str(before)]), bytes.fromhex(doc["roots"][str(size)])
    if before & (before - 1) == 0:
        proof = [r1, *proof]
    fn, sn = before - 1, size - 1
    while fn % 2 == 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = proof[0]
    for cc in proof[1:]:
        assert sn != 0
        if fn % 2 == 1 or fn == sn:
            fr, sr = node(cc, fr), node(cc, sr)
            if fn % 2 == 0:
                while fn % 2 == 0 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node(sr, cc)
        fn, sn = fn >> 1, sn >> 1
    assert (fr, sr, sn) == (r1, r2, 0)


def test_canonical_json_vectors_by_charter_and_the_naive_encoder() -> None:
    cases = json.loads((VECTORS / "canonical.json").read_text())["cases"]
    for case in cases:
        value = json.loads(case["input"])
        assert canonical_json(value).hex() == case["canonical_hex"], case["note"]
        assert enc(value).hex() == case["canonical_hex"], case["note"]
    # the documented differences from JCS are in the vectors
    by_note = {c["note"]: bytes.fromhex(c["canonical_hex"]) for c in cases}
    assert b"9007199254740993" in by_note["integers"]
    assert by_note["code-point key order"].index("\uffff".encode()) < by_note[
        "code-point key order"
    ].index("😀".encode())
    assert b"1e-07" in by_note["floats (Charter writes none)"]


def test_the_naive_verifier_is_not_a_yes_man() -> None:
    """The second implementation refuses what it must (a control for the parametrised
    test: it could otherwise agree by accepting everything)."""
    data = (VECTORS / "bundles/whole.jsonl").read_bytes()
    anchor = _cases()[0]["key"]
    naive_verify(data, anchor)
    with pytest.raises(NaiveError):
        naive_verify(data.replace(b'"context":false', b'"context":true', 1), anchor)
    with pytest.raises(NaiveError):
        naive_verify(data[:-10] + b"AAAAAAAAA\n", anchor)
