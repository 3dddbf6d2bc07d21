"""The flat JSON Lines export: one decoded record per entry, no nested objects and no JSON
inside strings (a grant's body is decoded into dotted keys)."""

from __future__ import annotations

import json
from pathlib import Path

from charter.audit.siem import flatten
from charter.ledger import Journal
from tests.audit._support import real_history
from tests.audit.test_cli_audit import charter


def _holds_json(value: object) -> bool:
    if not isinstance(value, str) or not value.startswith(("{", "[")):
        return False
    try:
        return isinstance(json.loads(value), dict | list)
    except ValueError:
        return False


def test_flatten_rules() -> None:
    out: dict[str, object] = {}
    flatten(
        "payload",
        {"a": {"b": 1}, "body": '{"x":{"y":[1,2]}}', "l": [1, "s"], "o": [{"k": 1}], "t": "{no"},
        out,
    )
    assert out == {
        "payload.a.b": 1,
        "payload.body.x.y": [1, 2],
        "payload.l": [1, "s"],
        "payload.o.0.k": 1,
        "payload.t": "{no",
    }


def test_jsonl_export_of_a_real_history_is_flat_and_decoded(
    journal_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    _, lineages = real_history(journal_url, home)
    out = tmp_path / "events.jsonl"
    result = charter("--json", "export", str(out), "--format", "jsonl", home=home, db=journal_url)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    with Journal.open(journal_url) as j:
        rows = list(j.rows())
    assert [r["position"] for r in records] == [r.position for r in rows]
    assert [r["hash"] for r in records] == [r.chain_hash.hex() for r in rows]
    for record in records:
        for key, value in record.items():
            assert not isinstance(value, dict), key
            assert not _holds_json(value), key
            if isinstance(value, list):
                assert not any(isinstance(v, dict) or _holds_json(v) for v in value), key
    grants = [r for r in records if r["type"] == "GrantMinted"]
    assert grants
    assert all("payload.body.terms.clearance" in g for g in grants)
    assert {g["payload.body.lineage"] for g in grants} >= set(lineages)
    sub = tmp_path / "sub.jsonl"
    only = charter(
        "export",
        str(sub),
        "--format",
        "jsonl",
        "--lineage",
        lineages[3],
        home=home,
        db=journal_url,
    )
    assert only.returncode == 0, only.stderr
    picked = [json.loads(line) for line in sub.read_text().splitlines()]
    assert picked
    assert all(lineages[3] in json.dumps(r) for r in picked)
    assert len(picked) < len(records)
