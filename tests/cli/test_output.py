"""Item 11: output people can read at 80 columns, filters for large fan-outs, decoded
journal payloads, ``--json`` after the command, natural order, durations for renew,
and a verify message that says what it checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.cli._run import charter
from tests.cli.conftest import spawn

NARROW = {"COLUMNS": "80"}


def _json(home: Path, *args: str) -> dict:  # type: ignore[type-arg]
    done = charter("--json", *args, home=home)
    assert done.returncode == 0, done.stderr
    data: dict = json.loads(done.stdout)  # type: ignore[type-arg]
    return data


def test_budgets_fit_80_columns_one_line_a_ledger(home: Path) -> None:
    workers = spawn(home, 12)
    done = charter("budgets", "--limit", "0", home=home, env=NARROW)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if "agent:root/sa-" in line]
    assert len(rows) == len(workers)  # one line each, none wrapped
    assert all(re.search(r"in \d+(\.\d+)?[smhd]\s*$", row) for row in rows)  # expiry whole


def test_filters_on_tree_budgets_and_journal_show(home: Path) -> None:
    workers = spawn(home, 6)
    released = workers[2]
    assert charter("lease", "release", released, home=home).returncode == 0
    only = _json(home, "budgets", "--status", "released")
    assert [line["lineage"] for line in only["ledgers"]] == [released]
    everyone = _json(home, "budgets")
    assert len(everyone["ledgers"]) == 7  # control: the filter is what removed the rest

    limited = _json(home, "tree", "--limit", "3")
    assert len(limited["nodes"]) == 3
    human = charter("tree", "--limit", "3", home=home)
    assert "4 more lineages not shown" in human.stdout

    scoped = _json(home, "tree", "--lineage", workers[0])
    assert [n["lineage"] for n in scoped["nodes"]] == [workers[0]]
    assert scoped == _json(home, "tree", workers[0])

    shown = charter("journal", "show", "--limit", "4", home=home)
    assert len(shown.stdout.splitlines()) == 4
    many = charter("--json", "journal", "show", "--lineage", workers[0], "--limit", "2",
                   home=home)  # fmt: skip
    assert len(many.stdout.splitlines()) == 2
    assert all(workers[0] in line for line in many.stdout.splitlines())


def test_journal_show_decodes_nested_json_and_shortens_unless_full(home: Path) -> None:
    spawn(home, 3)
    entries = [
        json.loads(line)
        for line in charter(
            "--json", "journal", "show", "--type", "GrantMinted", home=home
        ).stdout.splitlines()
    ]
    signature = entries[-1]["payload"]["signature"]
    assert isinstance(entries[-1]["payload"]["body"], str)  # JSON inside JSON, as stored

    short = charter("journal", "show", "--type", "GrantMinted", home=home).stdout.splitlines()
    assert len(short) == len(entries)
    assert all('\\"' not in line for line in short)  # no escaped JSON
    assert all("body={" in line for line in short)  # decoded
    assert all(signature not in line for line in short)
    assert max(len(line) for line in short) <= 160

    full = charter("journal", "show", "--type", "GrantMinted", "--full", home=home).stdout
    line = full.splitlines()[-1]
    last = json.loads(line[line.index("{") :])
    assert last["signature"] == signature
    assert isinstance(last["body"], dict)
    assert json.loads(entries[-1]["payload"]["body"]) == last["body"]


def test_json_is_accepted_after_the_command_too(home: Path) -> None:
    spawn(home, 2)
    before = charter("--json", "budgets", home=home)
    after = charter("budgets", "--json", home=home)
    nested = charter("journal", "verify", "--json", home=home)
    assert before.returncode == after.returncode == nested.returncode == 0
    first, second = json.loads(before.stdout), json.loads(after.stdout)
    first.pop("at_ms")
    second.pop("at_ms")
    assert first == second
    assert json.loads(nested.stdout)["ok"] is True
    # Control: the human rendering is not JSON.
    plain = charter("budgets", home=home)
    assert not plain.stdout.lstrip().startswith("{")


def test_lineages_sort_naturally(home: Path) -> None:
    spawn(home, 12)
    nodes = [n["lineage"] for n in _json(home, "tree")["nodes"]]
    assert nodes.index("agent:root/sa-2") < nodes.index("agent:root/sa-10")
    ledgers = [line["lineage"] for line in _json(home, "budgets")["ledgers"]]
    assert ledgers.index("agent:root/sa-9") < ledgers.index("agent:root/sa-11")
    human = charter("tree", home=home).stdout
    assert human.index("sa-2 ") < human.index("sa-10 ")


def test_lease_renew_takes_a_duration(home: Path) -> None:
    """Both forms are read and reach the lease book, which refuses them here: a spawned
    worker's lease already ends with its grant, and never outlives it (exit 4)."""
    worker = spawn(home, 1)[0]
    done = charter("--json", "lease", "renew", worker, "--for", "10h", home=home)
    assert done.returncode == 4, done.stderr
    assert "never outlives its grant" in done.stderr
    old_form = charter("lease", "renew", worker, "--until-ms", "253402300799999", home=home)
    assert old_form.returncode == 4, old_form.stderr
    assert "never outlives its grant" in old_form.stderr
    both = charter("lease", "renew", worker, "--for", "1h", "--until-ms", "1", home=home)
    assert both.returncode == 2
    assert "exactly one" in both.stderr


def test_verify_says_what_it_checked(home: Path) -> None:
    done = charter("journal", "verify", home=home)
    assert done.returncode == 0, done.stderr
    assert "hash chain of 5 entries verifies" in done.stdout
    assert "not checked by this command: grant signatures" in done.stdout
