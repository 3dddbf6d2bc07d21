"""The CLI, run as a real process: agent add/list, spawn (exit 4 on refusal), spawn-schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from charter.ledger import Journal
from tests.authority._support import refusals

COST = "tokens=300k,wall=10m,cpu=10m,mem=1GiB,egress=10MB"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    Journal.create(url).close()
    return os.environ | {"CHARTER_HOME": str(tmp_path / "home"), "CHARTER_DB": url}


def charter(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from charter.cli import main; main(sys.argv[1:])"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_agent_add_list_spawn_and_refusal(env: dict[str, str]) -> None:
    added = charter(
        env,
        "--json",
        "agent",
        "add",
        "lead",
        "--budget",
        "tokens=10M,wall=1h,cpu=1h,mem=4GiB,egress=1GB",
        "--tools",
        "Read,Bash",
        "--egress",
        "*.example.com",
        "--fanout",
        "10",
        "--clearance",
        "confidential",
    )
    assert added.returncode == 0, added.stderr
    record = json.loads(added.stdout)
    assert record["lineage"] == "agent:lead"
    assert record["ceiling"]["tools"] == ["Bash", "Read"]
    assert record["ceiling"]["clearance"] == "confidential"
    key = Path(env["CHARTER_HOME"]) / "keys" / "agent-lead.key"
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert record["trust_root"] not in key.read_text()  # the file holds the seed, not this

    listed = charter(env, "--json", "agent", "list")
    assert [a["name"] for a in json.loads(listed.stdout)] == ["lead"]

    spawned = charter(
        env,
        "--json",
        "spawn",
        "--parent",
        "agent:lead",
        "--width",
        "3",
        "--objective",
        "review each module for bugs",
        "--est-cost",
        COST,
        "--grant",
        '{"tools": ["Read", "Write"]}',
    )
    assert spawned.returncode == 0, spawned.stderr
    out = json.loads(spawned.stdout)
    assert out["children"] == ["agent:lead/sa-1", "agent:lead/sa-2", "agent:lead/sa-3"]
    assert out["gate"]["verdict"] == "positive"

    refused = charter(
        env,
        "spawn",
        "--parent",
        "agent:lead",
        "--width",
        "8",
        "--objective",
        "review each module for bugs",
        "--est-cost",
        COST,
    )
    assert refused.returncode == 4
    assert "refused (fanout-exhausted)" in refused.stderr
    with Journal.open(env["CHARTER_DB"]) as journal:
        assert [r.reason for r in refusals(journal)] == ["fanout-exhausted"]

    gated = charter(
        env,
        "--json",
        "spawn",
        "--parent",
        "agent:lead",
        "--width",
        "2",
        "--objective",
        "x",
        "--est-cost",
        COST,
    )
    assert gated.returncode == 4
    assert json.loads(gated.stdout)["reason"] == "gate-unknown"

    again = charter(env, "agent", "add", "lead")
    assert again.returncode == 1
    assert "already in the directory" in again.stderr
    bad = charter(env, "agent", "add", "x", "--budget", "tokens=1")
    assert bad.returncode == 2


def test_spawn_schema_prints_a_tool_definition(env: dict[str, str]) -> None:
    result = charter(env, "spawn-schema")
    assert result.returncode == 0
    tool = json.loads(result.stdout)
    assert tool["name"] == "spawn"
    assert "issuer" not in json.dumps(tool["input_schema"]["properties"])
    assert tool["input_schema"]["additionalProperties"] is False


def test_a_malformed_ceiling_setting_is_bad_input_not_a_silent_fail_open(
    env: dict[str, str],
) -> None:
    added = charter(
        env, "agent", "add", "lead", "--budget", "tokens=10M,wall=1h,cpu=1h,mem=4GiB,egress=1GB"
    )
    assert added.returncode == 0, added.stderr
    with Journal.open(env["CHARTER_DB"]) as journal:
        before = journal.head()
    args = (
        "spawn",
        "--parent",
        "agent:lead",
        "--width",
        "2",
        "--objective",
        "scan the estate host by host",
    )
    typo = charter(env | {"CHARTER_POPULATION_CEILING": "10k"}, *args, "--est-cost", COST)
    assert typo.returncode == 2  # bad input
    assert "CHARTER_POPULATION_CEILING='10k'" in typo.stderr
    with Journal.open(env["CHARTER_DB"]) as journal:
        assert journal.head() == before  # nothing decided, nothing journaled
        assert not list(journal.entries(types=("CeilingCheckFailedOpen",)))
    ok = charter(env | {"CHARTER_POPULATION_CEILING": "10"}, *args, "--est-cost", COST)
    assert ok.returncode == 0, ok.stderr  # control: a well-formed ceiling spawns
