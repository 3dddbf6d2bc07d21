"""The projection reads a GrantMinted's small fields without decoding the grant body;
it must agree with a full decode on real entries (whose bodies contain "fanout" too)."""

from __future__ import annotations

import json
from pathlib import Path

from charter.core import KeyStore
from charter.ledger import Journal
from charter.projections._fold import _minted_fields
from tests.budgets._support import ROOT_BUDGET, ceiling, intent, register_root, service


def test_tail_decode_matches_full_decode(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "home")
    with Journal.create(f"sqlite:///{tmp_path / 'j.db'}") as journal:
        register_root(journal, keys, "root", ceiling())
        svc = service(journal, keys)
        svc.spawn(svc.durable_caller("root"), intent(3, ROOT_BUDGET.split(4), fanout=2))
        rows = [r for r in journal.rows() if r.topic.startswith("GrantMinted/")]
    assert len(rows) == 4  # the root's ceiling grant and three children
    for row in rows:
        full = json.loads(row.state)["payload"]
        assert b"fanout" in full["body"].encode()  # the trap: the key is in the body too
        tail = _minted_fields(row.state)
        assert tail == {k: v for k, v in full.items() if k != "body"}
