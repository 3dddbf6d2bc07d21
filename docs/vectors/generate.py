"""Writes the known-answer vectors of docs/VERIFYING.md into this folder.

    PYTHONPATH=. python3 docs/vectors/generate.py          # rewrite the files
    PYTHONPATH=. python3 docs/vectors/generate.py --check  # exit 1 if any would change

Deterministic: every key is derived from a fixed seed, every commit time and batch id
is fixed, and Ed25519 signatures are deterministic, so the files are the same bytes on
every run (tests/audit/test_vectors.py checks it, then verifies each file with Charter's
verifier and with a naive one written from the specification).

The journal is built entry by entry as Charter stores it (the canonical state, the
frame, the chain), not through a database: a root registered with its trust root, its
ceiling grant and budget ledger, a gate and a fan-out of two workers with their grants
and leases, usage, a key rotation, a release, and an entry no rule reads.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from charter.audit import merkle
from charter.audit.bundle import (
    BundleWriter,
    LeafStream,
    entry_line,
    lineages_in,
    mentions,
)
from charter.audit.keys import KeyHistory, journal_origin
from charter.audit.note import Checkpoint, NoteKey, SignedNote, sign_checkpoint
from charter.audit.proofs import ConsistencyText, InclusionText
from charter.audit.rotation import rotation
from charter.authority import (
    AgentRegistered,
    Clearance,
    GateDecided,
    Grant,
    GrantMinted,
    GrantTerms,
    PermissionMode,
    Verdict,
    seal,
)
from charter.budgets import BudgetLedgerOpened, LeaseGranted, LeaseReleased, UsageRecorded
from charter.core import Budget, Event, Lineage
from charter.core.events import canonical_json
from charter.core.framing import (
    NOTE_ED25519,
    entry_frame,
    entry_hash,
    key_rotation_signing_input,
    merkle_node_hash,
)
from charter.ledger import JournalCreated
from charter.sandbox import SandboxProbeRefused
from tests.audit._support import as_v3 as as_v3_sealed
from tests.audit._support import bundle_lines, entry_bytes, flip_b64, join_lines, rechain_lines

HERE = Path(__file__).resolve().parent
T0 = 1_796_000_000_000  # 2026-11-30T...: the first commit time, in ms
BATCH = "0123456789abcdef0123456789abcdef"


def key(n: int) -> SigningKey:
    return SigningKey(hashlib.sha256(f"charter vector key {n}".encode()).digest())


JOURNAL, ROTATED, ROOT, CHILD1, CHILD2 = (key(i) for i in range(5))


def _at(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="microseconds")


def _budget(n: int) -> Budget:
    return Budget(tokens=n, wall_ms=n, cpu_ms=n, mem_bytes=n, egress_bytes=n)


def _terms(n: int, depth: int, fanout: int, egress: frozenset[str]) -> GrantTerms:
    return GrantTerms(
        tools=frozenset({"read"}),
        egress=egress,
        secrets=frozenset(),
        clearance=Clearance.INTERNAL,
        mode=PermissionMode.DEFAULT,
        depth=depth,
        fanout=fanout,
        budget=_budget(n),
        expires_at_ms=T0 + 10_000_000,
    )


def events() -> list[Event]:
    """The small journal's events, in order."""
    root = Lineage("agent:vec")
    kids = (Lineage("agent:vec/sa-1"), Lineage("agent:vec/sa-2"))
    ceiling = seal(
        Grant(
            lineage=root,
            issuer=root,
            subject_key=bytes(ROOT.verify_key).hex(),
            parent_digest=None,
            issued_at_ms=T0,
            terms=_terms(1000, 2, 3, frozenset({"10.0.0.0/8", "*.example.com"})),
        ),
        ROOT,
    )
    children = [
        seal(
            Grant(
                lineage=kid,
                issuer=root,
                subject_key=bytes(k.verify_key).hex(),
                parent_digest=ceiling.digest.hex(),
                issued_at_ms=T0 + 2,
                terms=_terms(100, 1, 0, frozenset({"10.0.0.7", "api.example.com"})),
            ),
            ROOT,
        )
        for kid, k in zip(kids, (CHILD1, CHILD2), strict=True)
    ]
    origin = journal_origin(bytes(JOURNAL.verify_key).hex())
    return [
        JournalCreated(journal_key=bytes(JOURNAL.verify_key).hex(), created_at=_at(T0)),
        AgentRegistered(name="vec", lineage=root, trust_root=bytes(ROOT.verify_key).hex()),
        GrantMinted.of("register", ceiling),
        BudgetLedgerOpened(lineage=str(root), allocation=_budget(1000)),
        GateDecided(
            fanout="f-1",
            actor=root,
            width=2,
            objective="the vectors: naïve, ünïcode",
            estimated_cost=_budget(100),
            verdict=Verdict.POSITIVE,
            reason="fixed",
            policy="fixed",
        ),
        *(GrantMinted.of("f-1", c) for c in children),
        LeaseGranted(
            parent=str(root),
            lineages=tuple(str(k) for k in kids),
            allocation=_budget(100),
            expires_at_ms=T0 + 10_000_000,
            fanout="f-1",
            grants=tuple(c.digest.hex() for c in children),
        ),
        UsageRecorded(lineage=str(kids[0]), amount=_budget(7), refused=_budget(0), exhausted=False),
        rotation(origin, JOURNAL, ROTATED),
        UsageRecorded(lineage=str(kids[1]), amount=_budget(9), refused=_budget(0), exhausted=False),
        SandboxProbeRefused(failed=("userns",), detail="a type no rule reads"),
        LeaseReleased(lineage=str(kids[0])),
        UsageRecorded(lineage=str(kids[1]), amount=_budget(1), refused=_budget(0), exhausted=False),
    ]


def rows(newline: bool = False) -> list[dict[str, Any]]:
    """The journal as stored: one row per entry, chained. Positions leave a gap (as
    PostgreSQL may); versions count per stream from 1; originators are uuid5 of the
    stream name; two entries share a batch and commit time. With ``newline``, one more
    entry, whose stored state (JSON, not canonical) holds a newline byte."""
    out: list[dict[str, Any]] = []
    versions: dict[str, int] = {}
    prev = bytes(32)
    position = 0
    extra = [SandboxProbeRefused(failed=("userns",), detail="a newline in its state")]
    for i, event in enumerate(events() + (extra if newline else [])):
        position += 2 if i == 5 else 1
        stream = event.stream() or f"standalone-{i}"
        versions[stream] = versions.get(stream, 0) + 1
        group = i if i < 6 else i - 1  # entries 5 and 6 appended (and committed) together
        state = canonical_json(
            {"at": _at(T0 + group), "batch": f"{BATCH[:-2]}{group:02x}", "payload": event.payload()}
        )
        if i == 14:  # the extra entry: JSON whitespace, a newline, before its last brace
            state = state[:-1] + b"\n}"
        originator = uuid.uuid5(uuid.NAMESPACE_URL, f"charter:{stream}").bytes
        topic = f"{event.type_name}/v{event.schema_version}"
        chain = entry_hash(prev, position, originator, versions[stream], topic.encode(), state)
        frame = entry_frame(prev, position, originator, versions[stream], topic.encode(), state)
        out.append(
            {
                "position": position,
                "originator": originator.hex(),
                "version": versions[stream],
                "topic": topic,
                "state": base64.b64encode(state).decode(),
                "state_text": state.decode(),
                "prev_hash": prev.hex(),
                "chain_hash": chain.hex(),
                "frame": frame.hex(),
                "leaf_hash": merkle.leaf_hash(frame).hex(),
            }
        )
        prev = chain
    return out


def _frame(row: dict[str, Any]) -> bytes:
    return bytes.fromhex(row["frame"])


def _history(table: list[dict[str, Any]]) -> KeyHistory:
    history = KeyHistory.start(
        journal_origin(bytes(JOURNAL.verify_key).hex()), bytes(JOURNAL.verify_key)
    )
    for leaf, row in enumerate(table):
        if row["topic"].startswith("JournalKeyRotated/"):
            history = history.rotated(leaf, json.loads(row["state_text"])["payload"])
    return history


def checkpoint(table: list[dict[str, Any]], size: int) -> str:
    history = _history(table)
    origin = history.origin
    leaves = [bytes.fromhex(r["leaf_hash"]) for r in table[:size]]
    signer = JOURNAL if history.key_for(size) == bytes(JOURNAL.verify_key) else ROTATED
    note = sign_checkpoint(
        Checkpoint(origin=origin, size=size, root=merkle.root_from_leaves(leaves)), origin, signer
    )
    return note.render()


def _nodes(table: list[dict[str, Any]]) -> merkle.NodeGetter:
    leaves = [bytes.fromhex(r["leaf_hash"]) for r in table]
    nodes: dict[tuple[int, int], bytes] = {}
    level_nodes = leaves
    level = 0
    while level_nodes:
        for i, h in enumerate(level_nodes):
            nodes[(level, i)] = h
        pairs = [
            merkle_node_hash(level_nodes[i], level_nodes[i + 1])
            for i in range(0, len(level_nodes) - 1, 2)
        ]
        level_nodes, level = pairs, level + 1
    return merkle.from_mapping(nodes)


def bundle(
    table: list[dict[str, Any]],
    *,
    lineage: str | None = None,
    start: int | None = None,
    stop: int | None = None,
) -> bytes:
    """The bundle ``charter export`` writes of ``table`` for this selection (the same
    writer; the selection and context rules of charter/audit/export.py)."""
    size = len(table)
    history = _history(table)
    whole = lineage is None and start is None and stop is None

    def selects(row: dict[str, Any]) -> bool:
        p = row["position"]
        in_range = (start is None or p >= start) and (stop is None or p <= stop)
        payload = json.loads(row["state_text"])["payload"]
        return in_range and (lineage is None or mentions(payload, lineage))

    named: set[str] = set()
    for row in table:
        if selects(row):
            for name in lineages_in(json.loads(row["state_text"])["payload"]):
                node = name
                while True:
                    named.add(node)
                    if "/" not in node:
                        break
                    node = node.rpartition("/")[0]
    out = io.BytesIO()
    writer = BundleWriter(
        out,
        selection={"lineage": lineage, "from": start, "to": stop},
        keys=history.up_to(size).to_json(),
        checkpoint=checkpoint(table, size),
    )
    stream = LeafStream(writer)
    for row in table:
        payload = json.loads(row["state_text"])["payload"]
        kind = row["topic"].partition("/")[0]
        is_context = not whole and not selects(row)
        in_context = (
            kind in ("GrantMinted", "AgentRegistered") and payload.get("lineage") in named
        ) or kind == "JournalKeyRotated"
        if is_context and not in_context:
            stream.omit(_frame(row))
            continue
        line = entry_line(
            position=row["position"],
            originator=bytes.fromhex(row["originator"]),
            version=row["version"],
            topic=row["topic"],
            state=base64.b64decode(row["state"]),
            prev_hash=bytes.fromhex(row["prev_hash"]),
            chain_hash=bytes.fromhex(row["chain_hash"]),
            leaf=stream.leaf,
            context=is_context,
        )
        stream.write(_frame(row), line, context=is_context)
    assert stream.root() == merkle.root_from_leaves([bytes.fromhex(r["leaf_hash"]) for r in table])
    writer.seal(ROTATED if history.key_for(size) != bytes(JOURNAL.verify_key) else JOURNAL)
    return out.getvalue()


# -- broken bundles: what an attacker without the key can do, and the failure -------------


def broken(whole: bytes, partial: bytes) -> list[tuple[str, str, bytes, str]]:
    """(name, what was done, bundle, the part its verification must fail at)."""
    w, p = bundle_lines(whole), bundle_lines(partial)
    out: list[tuple[str, str, bytes, str]] = []

    def case(name: str, what: str, data: bytes, part: str) -> None:
        out.append((name, what, data, part))

    e = w[4]
    flipped = [*w]
    flipped[4] = {**e, "state": flip_b64(e["state"])}
    case(
        "state-flipped",
        "one bit of an entry's state",
        join_lines(flipped),
        f"entry/{e['position']}",
    )
    case(
        "entry-dropped",
        "an entry's line removed from a whole bundle",
        join_lines(w[:4] + w[5:]),
        f"entry/{w[5]['position']}",
    )
    case(
        "entries-swapped",
        "two adjacent entry lines swapped",
        join_lines([*w[:4], w[5], w[4], *w[6:]]),
        f"entry/{w[5]['position']}",
    )
    state = base64.b64decode(e["state"]).replace(b'"at":"', b'"at":"1', 1)
    case(
        "rechained",
        "an entry changed and it and every later entry chained again",
        join_lines(rechain_lines(w, 4, state)),
        "tree",
    )
    header = w[0]
    parts = header["checkpoint"].split("\n")
    parts[1] = str(int(parts[1]) + 1)
    case(
        "checkpoint-size",
        "the checkpoint's size line changed",
        join_lines([{**header, "checkpoint": "\n".join(parts)}, *w[1:]]),
        "checkpoint",
    )
    case(
        "keys-cut",
        "the rotation's key removed from the header's key history",
        join_lines([{**header, "keys": header["keys"][:1]}, *w[1:]]),
        "checkpoint",
    )
    last = max(x["position"] for x in w if x["kind"] == "entry")
    case(
        "whole-relabelled",
        "a whole bundle relabelled from=1,to=<last> (its audit would be skipped)",
        join_lines([{**header, "selection": {"from": 1, "lineage": None, "to": last}}, *w[1:]]),
        "seal",
    )
    case("trailer-missing", "the last line (the seal) removed", join_lines(w[:-1]), "seal")
    case(
        "seal-flipped",
        "one bit of the seal",
        join_lines([*w[:-1], {**w[-1], "seal": flip_b64(w[-1]["seal"])}]),
        "seal",
    )
    ph = p[0]
    case(
        "partial-relabelled-whole",
        "a partial bundle relabelled as the whole journal",
        join_lines([{**ph, "selection": {"from": None, "lineage": None, "to": None}}, *p[1:]]),
        "selection",
    )
    case(
        "partial-relabelled-lineage",
        "a partial bundle relabelled to another lineage its entries do not name",
        join_lines([{**ph, "selection": {**ph["selection"], "lineage": "agent:vec/sa-9"}}, *p[1:]]),
        "selection",
    )
    gaps = [i for i, x in enumerate(p) if x["kind"] == "gap"]
    g = dict(p[gaps[0]])
    g["hashes"] = ["00" * 32, *g["hashes"][1:]]
    case(
        "gap-hash",
        "one hash of a gap replaced",
        join_lines([*p[: gaps[0]], g, *p[gaps[0] + 1 :]]),
        "tree",
    )
    grants = [i for i, x in enumerate(w) if x.get("topic", "").startswith("GrantMinted/")]
    i = grants[-1]
    doc = json.loads(base64.b64decode(w[i]["state"]))
    doc["payload"]["signature"] = "00" * 64
    case(
        "grant-forged",
        "a worker's grant signature zeroed, the chain re-hashed to the end",
        join_lines(rechain_lines(w, i, canonical_json(doc))),
        f"grants/{doc['payload']['lineage']}",
    )
    g = next(x for x in w if x.get("topic", "").startswith("GateDecided/"))  # non-ASCII
    i = w.index(g)
    respelled = entry_bytes(g).replace("ï".encode(), b"\\u00ef", 1)
    case(
        "state-respelled",
        "an entry's embedded state spelled another way (a character as a JSON escape): the "
        "same JSON value, other bytes, its chain hash kept",
        join_lines(w[:i]) + respelled + join_lines(w[i + 1 :]),
        f"entry/{g['position']}",
    )
    case(
        "state-short",
        "an entry line's closing brace removed: its state is read one byte short",
        join_lines(w[:4]) + entry_bytes(e)[:-2] + b"\n" + join_lines(w[5:]),
        f"entry/{e['position']}",
    )
    case(
        "entry-unterminated",
        "a space after an entry line's closing brace (its state's end is then not found)",
        join_lines(w[:4]) + entry_bytes(e)[:-1] + b" \n" + join_lines(w[5:]),
        f"leaf/{e['leaf']}",
    )
    v2 = canonical_json({"checkpoint": "", "entries": [], "format": "charter/bundle@v2"})
    case("format-v2", "a bundle of the earlier one-document format", v2, "format")
    v3 = bundle_lines(as_v3(whole))
    v3_flipped = [*v3]
    v3_flipped[4] = {**e, "state": flip_b64(e["state"])}
    case(
        "v3-state-flipped",
        "one bit of an entry's state in a charter/bundle@v3 bundle (base64)",
        b"".join(canonical_json(x) + b"\n" for x in v3_flipped),
        f"entry/{e['position']}",
    )
    return out


def as_v3(data: bytes) -> bytes:
    """A bundle of the whole journal in the format before this one (``charter/bundle@v3``),
    sealed again by the key that sealed it (the rotated key: the tree is past the
    rotation)."""
    return as_v3_sealed(data, ROTATED)


CANONICAL = [  # (input JSON text, a note)
    ('{"b": 1, "a": [true, false, null], "c": {"z": "", "y": -0}}', "key order, literals"),
    ('{"s": "naïve — ünïcode ✓ 😀"}', "non-ASCII is raw UTF-8"),
    ('{"s": "\\u0000\\u0007\\b\\t\\n\\u000b\\f\\r\\u001f\\"\\\\/\\u007f"}', "escapes"),
    ('{"s": "\\u2028\\u2029"}', "U+2028/9 stay raw"),
    ('{"n": [0, -1, 9007199254740993, 9223372036854775807, -9223372036854775808]}', "integers"),
    ('{"\\uffff": 1, "\\ud83d\\ude00": 2, "\\u00e9": 3, "Z": 4, "a": 5}', "code-point key order"),
    ('{"f": [0.1, 1e-07, 1e16, 2.5e-300, -0.0]}', "floats (Charter writes none)"),
]


def files() -> dict[str, bytes]:
    table = rows()
    size = len(table)
    rot_leaf = next(i for i, r in enumerate(table) if r["topic"].startswith("JournalKeyRotated"))
    origin = journal_origin(bytes(JOURNAL.verify_key).hex())
    anchor = NoteKey.make(origin, NOTE_ED25519, bytes(JOURNAL.verify_key)).text()
    rotated = NoteKey.make(origin, NOTE_ED25519, bytes(ROTATED.verify_key)).text()
    rot = json.loads(table[rot_leaf]["state_text"])["payload"]
    get = _nodes(table)
    before = rot_leaf  # the tree of the entries before the rotation: signed by the anchor
    out: dict[str, bytes] = {}
    journal_doc = {
        "anchor_key": anchor,
        "rotated_key": rotated,
        "origin": origin,
        "rotation": {
            "leaf": rot_leaf,
            "signing_input": key_rotation_signing_input(
                origin, bytes.fromhex(rot["old_key"]), bytes.fromhex(rot["new_key"])
            ).hex(),
        },
        "entries": table,
        "roots": {
            str(n): merkle.root_from_leaves(
                [bytes.fromhex(r["leaf_hash"]) for r in table[:n]]
            ).hex()
            for n in range(size + 1)
        },
    }
    out["journal.json"] = (json.dumps(journal_doc, indent=1, ensure_ascii=False) + "\n").encode()
    out[f"checkpoint-{size}.txt"] = checkpoint(table, size).encode()
    out[f"checkpoint-{before}.txt"] = checkpoint(table, before).encode()
    inclusion = InclusionText(
        frame=_frame(table[3]),
        index=3,
        path=merkle.inclusion_proof(get, 3, size),
        note=SignedNote.parse(checkpoint(table, size)),
    )
    out["inclusion-3.txt"] = inclusion.render().encode()
    out[f"consistency-{before}-{size}.txt"] = (
        ConsistencyText(old=before, new=size, path=merkle.consistency_proof(get, before, size))
        .render()
        .encode()
    )
    whole = bundle(table)
    partial = bundle(table, lineage="agent:vec/sa-2")
    ranged = bundle(table, start=9, stop=12)
    out["bundles/whole.jsonl"] = whole
    out["bundles/lineage-sa-2.jsonl"] = partial
    out["bundles/range-9-12.jsonl"] = ranged
    out["bundles/newline-state.jsonl"] = bundle(rows(newline=True))
    out["bundles/whole-v3.jsonl"] = as_v3(whole)
    cases: list[dict[str, Any]] = [
        {"file": f"bundles/{n}.jsonl", "key": anchor, "expect": "ok", "what": w}
        for n, w in (
            ("whole", "every leaf; audited, no findings"),
            ("lineage-sa-2", "the entries naming agent:vec/sa-2, their grant chains, the rotation"),
            ("range-9-12", "positions 9..12, their grant chains, the rotation"),
            (
                "newline-state",
                "the journal with one more entry, whose state holds a newline byte: its line "
                "gives the state in base64 (state_base64)",
            ),
            ("whole-v3", "the whole bundle in the format before (charter/bundle@v3)"),
        )
    ]
    for name, what, data, part in broken(whole, partial):
        out[f"bundles/broken/{name}.jsonl"] = data
        cases.append(
            {"file": f"bundles/broken/{name}.jsonl", "key": anchor, "expect": part, "what": what}
        )
    cases.append(
        {
            "file": "bundles/whole.jsonl",
            "key": rotated,
            "expect": "keys",
            "what": "verified with the rotated key instead of the anchor",
        }
    )
    out["bundles.json"] = (json.dumps({"cases": cases}, indent=1) + "\n").encode()
    canonical_cases = [
        {"input": text, "note": note, "canonical_hex": canonical_json(json.loads(text)).hex()}
        for text, note in CANONICAL
    ]
    out["canonical.json"] = (
        json.dumps({"cases": canonical_cases}, indent=1, ensure_ascii=False) + "\n"
    ).encode()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file would change")
    args = parser.parse_args()
    changed = []
    for name, data in files().items():
        path = HERE / name
        if not path.exists() or path.read_bytes() != data:
            changed.append(name)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
    for name in changed:
        print(("would change: " if args.check else "wrote: ") + name)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
