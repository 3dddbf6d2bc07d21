"""The one scenario both transports run: an official-SDK MCP client lists the tools,
spawns through the intent-only tool (identity fields refused, with the same intent
without them as the control), waits for the children in bounded polls, reads its
budget and subtree and revokes a descendant; every result's position is checked
against the journal."""

from __future__ import annotations

import time
from typing import Any

from mcp import Client

from charter.app import Charter
from charter.authority import GrantMinted, LineageRevoked, spawn_tool_definition
from charter.runner.events import WorkerEnded
from tests.mcp._support import INTENT

TOOLS = {"spawn", "wait", "budget", "subtree", "revoke", "whoami"}


async def call(client: Client, name: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    result = await client.call_tool(name, arguments)
    body = result.structured_content
    assert isinstance(body, dict), result
    assert "position" in body, body  # every result, refusals included
    return result.is_error, body


def head(charter: Charter) -> int:
    found = charter.journal.head()
    return found[0] if found else 0


async def fan_out_wait_and_read(client: Client, charter: Charter) -> dict[str, Any]:
    listed = await client.list_tools()
    tools = {t.name: t for t in listed.tools}
    assert set(tools) == TOOLS
    # The spawn tool's input schema is exactly `charter spawn-schema`'s.
    assert tools["spawn"].input_schema == spawn_tool_definition()["input_schema"]

    error, me = await call(client, "whoami", {})
    assert not error
    assert me["position"] <= head(charter)

    # Identity in the arguments is refused, wherever it is put; nothing is minted.
    before = head(charter)
    for extra in ({"parent": "agent:estate"}, {"lineage": "agent:other"}, {"cell": "local"}):
        error, body = await call(client, "spawn", INTENT | extra)
        assert error, body
        assert body["reason"] == "identity-in-arguments", body
    error, body = await call(client, "spawn", INTENT | {"colour": "blue"})
    assert error
    assert body["reason"] == "bad-input", body  # any other unknown field too
    minted = [e for e in charter.journal.entries(before + 1) if isinstance(e.event, GrantMinted)]
    assert minted == []

    # The control: the same intent, nothing added, is a fan-out.
    error, spawned = await call(client, "spawn", INTENT)
    assert not error, spawned
    children = spawned["children"]
    assert len(children) == 2
    assert all(c.startswith("agent:estate/") for c in children)
    first, last = spawned["positions"]
    assert spawned["position"] == last
    grants = {
        str(e.event.lineage): e.position
        for e in charter.journal.entries(first, last)
        if isinstance(e.event, GrantMinted)
    }
    assert set(grants) == set(children)  # the position is the fan-out's commit

    # Bounded polls: each call returns within its timeout (plus the server's step).
    error, body = await call(client, "wait", {"children": children, "timeout_s": 31})
    assert error
    assert body["reason"] == "bad-input"  # never longer than 30 s a call
    error, body = await call(client, "wait", {"children": ["agent:estate/sa-nope"]})
    assert error
    assert body["reason"] == "not-a-child"
    cursor = None
    answer: dict[str, Any] = {}
    for _ in range(60):
        asked = {"children": children, "timeout_s": 2.0} | (
            {"cursor": cursor} if cursor is not None else {}
        )
        started = time.monotonic()
        error, answer = await call(client, "wait", asked)
        assert not error, answer
        assert time.monotonic() - started < 2.0 + 10.0, "a wait call outlived its bound"
        assert set(answer["done"]) | set(answer["pending"]) == set(children)
        if cursor is not None:  # what ended after the cursor is what `new` names
            assert all(answer["done"][c]["ended_at"] > cursor for c in answer["new"])
        cursor = answer["cursor"]
        if answer["complete"]:
            break
    assert answer["complete"], answer
    ended = {e.position: e.event for e in charter.journal.entries(types=("WorkerEnded",))}
    for child, done in answer["done"].items():
        assert done["status"] == "exited", done
        assert done["exit_code"] == 0, done
        assert "hello from a worker" in (done["result"] or ""), done
        event = ended[done["ended_at"]]
        assert isinstance(event, WorkerEnded)
        assert event.lineage == child
        assert done["ended_at"] <= answer["position"] <= head(charter)

    # Its own budget and subtree, as of a position at or after the fan-out.
    error, budget = await call(client, "budget", {})
    assert not error
    assert last <= budget["position"] <= head(charter)
    lineages = {line["lineage"] for line in budget["ledgers"]}
    assert {"agent:estate", *children} <= lineages
    error, tree = await call(client, "subtree", {})
    assert not error
    assert last <= tree["position"] <= head(charter)
    assert set(children) <= {node["lineage"] for node in tree["nodes"]}

    # Revoke: only its own descendants; a sibling tree and itself are refused.
    for target in ("agent:other/sa-1", "agent:estate"):
        error, body = await call(client, "revoke", {"lineage": target})
        assert error, body
        assert body["reason"] == "not-a-descendant", body
    error, revoked = await call(client, "revoke", {"lineage": children[0], "reason": "test"})
    assert not error
    assert revoked["revoked"] is True, revoked
    (entry,) = charter.journal.entries(revoked["position"], revoked["position"])
    assert isinstance(entry.event, LineageRevoked)
    assert str(entry.event.lineage) == children[0]
    return {"children": children, "spawned": spawned, "answer": answer}
