"""Journals for the auditor's tests, and an attacker's tools (raw SQL, re-hashing)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from charter.core.events import canonical_json
from charter.core.framing import entry_hash
from charter.ledger import Journal
from tests.journal._support import Counter, Ping
from tests.journal.test_contract import _Raw

__all__ = [
    "Counter",
    "Ping",
    "_Raw",
    "as_v3",
    "bundle_lines",
    "entry_bytes",
    "fill",
    "fill_real",
    "flip_b64",
    "join_lines",
    "make_journal",
    "rechain_lines",
    "rehash_from",
]


def make_journal(url: str) -> tuple[Journal, SigningKey]:
    key = SigningKey.generate()
    return Journal.create(url, journal_key=bytes(key.verify_key).hex()), key


def fill(journal: Journal, batches: int, size: int = 3, tag: str = "w") -> None:
    for b in range(batches):
        journal.append(
            [Ping(writer=tag, batch=b, n=i, pad="p" * (b % 5)) for i in range(size - 1)]
            + [Counter(name=f"{tag}{b % 3}", value=b)]
        )


def fill_real(journal: Journal, batches: int, size: int = 3, tag: str = "w") -> None:
    """Like :func:`fill`, with a type Charter writes (``charter audit`` reports the test
    types as entries of a type it does not know) that no audit rule reads."""
    from charter.sandbox import SandboxProbeRefused

    for b in range(batches):
        journal.append([SandboxProbeRefused(failed=(tag,), detail=f"{b}.{i}") for i in range(size)])


def rehash_from(url: str, raw: _Raw, position: int, state: bytes | None = None) -> None:
    """The consistent re-hash: (optionally) change the state of the entry at ``position``
    and recompute the chain from there on, so the chain walk alone finds nothing."""
    with Journal.open(url) as j:
        rows = list(j.rows())
    prev = bytes(32)
    for row in rows:
        if row.position < position:
            prev = row.chain_hash
            continue
        new_state = state if (row.position == position and state is not None) else row.state
        new_hash = entry_hash(
            prev, row.position, row.originator, row.version, row.topic.encode(), new_state
        )
        raw.execute(
            f"UPDATE {raw.table} SET state = ?, prev_hash = ?, chain_hash = ? WHERE {raw.pos} = ?",
            (new_state, prev, new_hash, row.position),
        )
        prev = new_hash


BUDGET = "tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB"
COST = "tokens=10k,wall=1m,cpu=1m,mem=64MiB,egress=1MB"


def real_history(url: str, home: Path) -> tuple[str, list[str]]:
    """A real journal made by the product: init, a fan-out of 3 under the root, a fan-out
    of 2 under its first worker. Returns the journal's verifier key and the lineages."""
    from charter.app import CellSetup, Charter, Settings
    from charter.audit.tree import MerkleLog
    from charter.authority import FixedPolicy, RequestedGrant, SpawnIntent, Verdict
    from charter.control import Ceiling
    from charter.core import Budget, KeyStore

    charter, _ = Charter.initialise(
        url,
        root="estate",
        ceiling=Ceiling(budget=Budget.parse(BUDGET)),
        cell=CellSetup(cores=8, reserve=1),
        keys=KeyStore(home),
        settings=Settings(),
    )
    with charter:
        positive = FixedPolicy(Verdict.POSITIVE)
        root = charter.spawn_service().durable_caller("estate")
        cost = Budget.parse(COST)
        first = charter.spawn(
            root,
            SpawnIntent(
                width=3,
                objective="survey the estate",
                estimated_cost=cost,
                grant=RequestedGrant(fanout=2),
            ),
            policy=positive,
        )
        worker = root.child(first.children[0])
        second = charter.spawn(
            worker,
            SpawnIntent(
                width=2,
                objective="survey one wing",
                estimated_cost=Budget.parse("tokens=2k,wall=10s,cpu=10s,mem=16MiB,egress=100KB"),
            ),
            policy=positive,
        )
        lineages = [str(c.lineage) for c in (*first.children, *second.children)]
        vkey = MerkleLog(charter.journal).anchor_key().text()
    return vkey, lineages


# -- an attacker's tools for bundles (charter/bundle@v4 lines), without the journal key --

_STATE = b',"state":'


def bundle_lines(data: bytes) -> list[dict[str, Any]]:
    """A bundle's lines as objects, an entry's state as base64 text in its ``state``
    (embedded raw in a line, or in its ``state_base64``; a ``charter/bundle@v3``
    bundle's lines are their objects)."""
    out: list[dict[str, Any]] = []
    for line in data.splitlines():
        if out and out[0].get("format") == "charter/bundle@v3":
            out.append(json.loads(line))
            continue
        cut = line.find(_STATE)
        if cut >= 0:
            obj = json.loads(line[:cut] + b"}")
            obj["state"] = base64.b64encode(line[cut + len(_STATE) : -1]).decode()
        else:
            obj = json.loads(line)
            if "state_base64" in obj:
                obj["state"] = obj.pop("state_base64")
        out.append(obj)
    return out


def entry_bytes(obj: dict[str, Any]) -> bytes:
    """An entry's object (its state as base64 text) as its line: the canonical JSON of
    its other fields, the state's bytes inserted before the closing brace (in base64, as
    ``state_base64``, if they hold a newline)."""
    fields = {k: v for k, v in obj.items() if k != "state"}
    state = base64.b64decode(obj["state"])
    if b"\n" in state:
        return canonical_json({**fields, "state_base64": obj["state"]}) + b"\n"
    return canonical_json(fields)[:-1] + _STATE + state + b"}\n"


def join_lines(lines: list[dict[str, Any]]) -> bytes:
    """An attacker's bundle: each line encoded again as the exporter writes it (the seal
    is kept)."""
    return b"".join(
        entry_bytes(line)
        if line.get("kind") == "entry" and isinstance(line.get("state"), str)
        else canonical_json(line) + b"\n"
        for line in lines
    )


def flip_b64(text: str) -> str:
    """One bit flipped in the middle of a base64 text."""
    raw = bytearray(base64.b64decode(text))
    raw[len(raw) // 2] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def rechain_lines(lines: list[dict[str, Any]], i: int, state: bytes) -> list[dict[str, Any]]:
    """The consistent re-hash inside a bundle: line ``i`` gets ``state``, and it and
    every entry line after it are chained again."""
    out = [dict(line) for line in lines]
    prev = bytes.fromhex(out[i]["prev_hash"])
    for j, line in enumerate(out[i:], start=i):
        if line["kind"] != "entry":
            continue
        if j == i:
            line["state"] = base64.b64encode(state).decode()
        new = entry_hash(
            prev,
            line["position"],
            bytes.fromhex(line["originator"]),
            line["version"],
            line["topic"].encode(),
            base64.b64decode(line["state"]),
        )
        line["prev_hash"], line["chain_hash"] = prev.hex(), new.hex()
        prev = new
    return out


def as_v3(data: bytes, key: SigningKey) -> bytes:
    """A bundle in the format before (``charter/bundle@v3``: every line its object's
    canonical JSON, an entry's state base64 in its ``state`` field), sealed again by
    ``key`` (the key that sealed it: the exporter's, not an attacker's)."""
    from charter.audit.bundle import seal_signing_input

    lines = bundle_lines(data)
    lines[0] = {**lines[0], "format": "charter/bundle@v3"}
    body = b"".join(canonical_json(line) + b"\n" for line in lines[:-1])
    seal = key.sign(seal_signing_input(hashlib.sha256(body).digest())).signature
    trailer = {**lines[-1], "seal": base64.b64encode(seal).decode()}
    return body + canonical_json(trailer) + b"\n"
