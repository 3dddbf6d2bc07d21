"""The CLI contract of ``budgets``, ``tree``, ``slots`` and ``project``, run as real
processes against real SQLite and PostgreSQL journals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from charter.ledger import Journal
from tests.projections.history import History


def charter(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CHARTER_DB"}
    env["CHARTER_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "charter", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_read_commands_are_never_stale_and_answer_as_of(journal_url: str, tmp_path: Path) -> None:
    Journal.create(journal_url).close()
    history = History(21, roots=1).batches(10_000)
    with Journal.open(journal_url) as journal:
        for _ in range(25):
            journal.append(next(history))
        first_head = journal.head()
        assert first_head is not None
        budgets = _json(charter("--db", journal_url, "--json", "budgets", home=tmp_path))
        assert budgets["as_of"] == first_head[0]
        # Without --as-of, time is now (a lease may expire with no entry to say so);
        # as of a position, it is that entry's commit time, so the answer is fixed.
        then = ("--as-of", str(first_head[0]))
        budgets = _json(charter("--db", journal_url, "--json", "budgets", *then, home=tmp_path))
        root = next(b for b in budgets["ledgers"] if b["lineage"] == "agent:r0")
        assert set(root["remaining"]) == {
            "tokens",
            "wall_ms",
            "cpu_ms",
            "mem_bytes",
            "egress_bytes",
        }
        # New commits are visible to the next read without running `project`.
        for _ in range(10):
            journal.append(next(history))
        head = journal.head()
        assert head is not None
        assert head[0] > first_head[0]
        tree = _json(charter("--db", journal_url, "--json", "tree", home=tmp_path))
        assert tree["as_of"] == head[0]
        # As of the earlier position, the answer is the one given then.
        again = _json(
            charter(
                "--db",
                journal_url,
                "--json",
                "budgets",
                "--as-of",
                str(first_head[0]),
                home=tmp_path,
            )
        )
        assert again == budgets
        old_tree = _json(
            charter(
                "--db",
                journal_url,
                "--json",
                "tree",
                "--as-of",
                str(first_head[0]),
                home=tmp_path,
            )
        )
        assert len(old_tree["nodes"]) < len(tree["nodes"])
        child = next(n["lineage"] for n in tree["nodes"] if n["depth"] == 1)
        sub = _json(charter("--db", journal_url, "--json", "tree", child, home=tmp_path))
        assert {n["lineage"] for n in sub["nodes"]} == {
            n["lineage"]
            for n in tree["nodes"]
            if n["lineage"] == child or n["lineage"].startswith(child + "/")
        }
        slots = _json(charter("--db", journal_url, "--json", "slots", home=tmp_path))
        assert {c["cell"] for c in slots["cells"]} == {"c1", "c2"}
        assert set(slots["cells"][0]["slots"]) == {
            "processing",
            "egress",
            "inference",
            "coordination",
        }

        text = charter("--db", journal_url, "tree", home=tmp_path)
        assert text.returncode == 0, text.stderr
        assert "agent:r0" in text.stdout
        assert child.rsplit("/", 1)[-1] in text.stdout

        beyond = charter("--db", journal_url, "budgets", "--as-of", str(head[0] + 5), home=tmp_path)
        assert beyond.returncode == 2  # bad input
        assert "past the projected position" in beyond.stderr

        at_head = ("--as-of", str(head[0]))
        tree = _json(charter("--db", journal_url, "--json", "tree", *at_head, home=tmp_path))
        rebuilt = _json(
            charter("--db", journal_url, "--json", "project", "--rebuild", home=tmp_path)
        )
        rows = sum(1 for _ in journal.rows())
        assert rebuilt["position"] == head[0]
        assert rebuilt["entries"] == rows
        again_tree = charter("--db", journal_url, "--json", "tree", *at_head, home=tmp_path)
        assert _json(again_tree) == tree


def test_human_amounts_never_print_an_exponent() -> None:
    from charter.cli._render import _BYTES, _TIME, _TOKENS, _amount

    assert _amount(999_999, _TOKENS) == "1M"  # rounds up into the next unit
    assert _amount(1_048_575, _BYTES) == "1020KiB"
    assert _amount(1_500, _TOKENS) == "1.5k"
    assert _amount(59_999, _TIME) == "1m"
    assert _amount(0, _BYTES) == "0B"
    for value in (999, 999_499, 999_500, 10**9 - 1, 2**40 - 1):
        assert "e" not in _amount(value, _TOKENS) + _amount(value, _BYTES)
