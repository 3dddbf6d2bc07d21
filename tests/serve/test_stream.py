"""The page's event stream over a real socket, on SQLite and PostgreSQL: one snapshot,
then deltas that rebuild each new snapshot from the one before (applied here by the
rules docs/serve.md states, written apart from the server's diff), far smaller than
the snapshot; a client the held deltas cannot serve gets a snapshot; an update is
pushed within 1 s of its commit."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import charter.serve._app as serve_app
from charter.app import Charter
from charter.core import Budget
from charter.serve import Fabric
from charter.serve._delta import diff
from tests.serve._support import HOSTILE, WIDE, fan_out, head, node_lineages, served, sse

# docs/serve.md, "The stream": the keyed paths, their keys, and the one newest first
KEYS = {
    "tree.nodes": "lineage",
    "budgets.ledgers": "lineage",
    "slots.cells": "cell",
    "events": "position",
    "burndown": "position",
}
NEWEST_FIRST = {"events"}
USED = Budget(tokens=100, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)
Event = tuple[str, str, dict[str, Any], int]


def apply(document: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """``delta`` applied to a copy of ``document``: set, drop, upsert, then each keyed
    path sorted by its key. Dropping a key that is not there is an error."""
    out = copy.deepcopy(document)

    def holder(path: str) -> tuple[dict[str, Any], str]:
        outer, _, inner = path.partition(".")
        return (out[outer], inner) if inner else (out, outer)

    for path, value in delta["set"].items():
        place, name = holder(path)
        place[name] = value
    for path in {*delta["drop"], *delta["upsert"]}:
        place, name = holder(path)
        gone = delta["drop"].get(path, [])
        if path in KEYS:
            key = KEYS[path]
            items = {item[key]: item for item in place[name]}
            for k in gone:
                del items[k]
            for item in delta["upsert"].get(path, []):
                items[item[key]] = item
            place[name] = sorted(
                items.values(), key=lambda item: item[key], reverse=path in NEWEST_FIRST
            )
        else:
            for k in gone:
                del place[name][k]
            place[name].update(delta["upsert"].get(path, {}))
    return out


def _until(events: Iterator[Event], position: int) -> list[Event]:
    """The stream's events up to the one at ``position``."""
    found: list[Event] = []
    for event in events:
        found.append(event)
        if event[2]["position"] >= position:
            return found
    raise AssertionError(f"the stream ended before position {position}")


def _stream(client: httpx.Client, **headers: str) -> Any:
    return client.stream("GET", "/api/stream", headers=headers)


def test_an_update_is_a_small_delta_that_rebuilds_the_snapshot(
    estate: Charter, fabric: Fabric
) -> None:
    workers = fan_out(estate, 100, cost=WIDE) + fan_out(estate, 100, cost=WIDE)
    for lineage in workers[:60]:  # 62 listed events: the next one pushes the oldest out
        estate.revoke(lineage, reason="fill the page's list of events")
    with (
        served(fabric) as url,
        httpx.Client(base_url=url, timeout=10) as client,
        _stream(client) as stream,
    ):
        events = sse(stream.iter_lines())
        kind, ident, state, whole = next(events)
        assert kind == "snapshot"
        assert state["position"] == head(estate)
        assert ident.startswith(f"{state['position']}@")
        assert len(node_lineages(state)) == 1 + len(workers)
        oldest = state["events"][-1]["position"]

        def commit_and_apply(act: Any) -> list[dict[str, Any]]:
            nonlocal state
            act()
            deltas = []
            for kind, ident, delta, size in _until(events, head(estate)):
                assert kind == "delta"
                assert ident.startswith(f"{delta['position']}@")
                assert delta["base"] == state["position"]
                assert size * 20 < whole, f"a delta of {size} bytes beside {whole}"
                before, state = state, apply(state, delta)
                deltas.append({"delta": delta, "before": before})
            now = client.get("/api/fabric").json()
            assert now["position"] == state["position"] == head(estate)
            assert state == now
            return deltas

        # a removal (the oldest listed event), a new event and a verdict
        [revoked] = commit_and_apply(lambda: estate.revoke(workers[100], reason=HOSTILE))
        delta = revoked["delta"]
        assert delta["drop"] == {"events": [oldest]}
        assert delta["upsert"]["verdicts"] == {workers[100]: "revoked"}
        [listed] = delta["upsert"]["events"]
        assert listed["type"] == "LineageRevoked"
        assert "\\x1b[31m" in listed["reason"]  # worker text escaped in a delta too
        assert "\x1b" not in listed["reason"]
        assert "\u202e" not in listed["reason"]
        assert "tree.nodes" not in delta["upsert"]  # only what changed is sent
        # the controls: the comparison sees a removal left out
        assert apply(revoked["before"], {**delta, "drop": {}}) != state

        # a changed field: the worker's tokens, and its ledger and its parent's
        [used] = commit_and_apply(lambda: estate.budgets().record_usage(workers[101], USED))
        delta = used["delta"]
        [node] = delta["upsert"]["tree.nodes"]
        assert node["lineage"] == workers[101]
        assert node["tokens_spent"] == USED.tokens
        assert {line["lineage"] for line in delta["upsert"]["budgets.ledgers"]} == {
            workers[101],
            "agent:estate",
        }
        assert delta["drop"] == {}
        # the controls: the comparison sees a change left out, or misapplied
        assert apply(used["before"], {**delta, "upsert": {}}) != state
        wrong = copy.deepcopy(delta)
        wrong["upsert"]["tree.nodes"][0]["tokens_spent"] = 0
        assert apply(used["before"], wrong) != state


def test_a_client_the_deltas_cannot_serve_gets_a_snapshot(
    estate: Charter, fabric: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serve_app, "_RETAINED", 2)  # the hub holds its newest 2 deltas
    workers = fan_out(estate, 3)
    with served(fabric) as url, httpx.Client(base_url=url, timeout=10) as client:
        with _stream(client) as stream:
            events = sse(stream.iter_lines())
            ids = [next(events)[1]]
            for lineage in workers:  # a revoke is one append
                estate.revoke(lineage, reason="one commit")
                ids += [ident for _, ident, _, _ in _until(events, head(estate))]
        assert len(ids) == 4  # a snapshot, then one delta per commit
        now = head(estate)
        position, tag = ids[1].split("@")

        def first(**headers: str) -> tuple[str, dict[str, Any]]:
            with _stream(client, **headers) as stream:
                kind, _, data, _ = next(sse(stream.iter_lines()))
            return kind, data

        # the positive control: a position whose deltas the hub holds gets them
        kind, data = first(**{"last-event-id": ids[1]})
        assert (kind, data["base"]) == ("delta", int(position))
        # the deltas from the snapshot's position are gone: a snapshot
        kind, data = first(**{"last-event-id": ids[0]})
        assert (kind, data["position"]) == ("snapshot", now)
        # another process's fabric at a held position (its burn-down sampled apart)
        kind, data = first(**{"last-event-id": f"{position}@{'0' * len(tag)}"})
        assert (kind, data["position"]) == ("snapshot", now)
        # a bare position, as ?after= or an id: the snapshot once the journal moves past
        with client.stream("GET", "/api/stream", params={"after": position}) as stream:
            kind, _, data, _ = next(sse(stream.iter_lines()))
        assert (kind, data["position"]) == ("snapshot", now)
        refused = client.get("/api/stream", headers={"last-event-id": "x@" + tag})
        assert refused.status_code == 400


def test_the_stream_pushes_each_commit(estate: Charter, fabric: Fabric) -> None:
    fan_out(estate, 2)
    with (
        served(fabric) as url,
        httpx.Client(base_url=url, timeout=10) as client,
        client.stream("GET", "/api/stream", params={"after": 0}) as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = sse(stream.iter_lines())
        kind, _, state, _ = next(events)
        assert (kind, state["position"]) == ("snapshot", head(estate))
        started = time.monotonic()
        children = fan_out(estate, 3)
        pushed = _until(events, head(estate))
        elapsed = time.monotonic() - started
        for kind, _, delta, _ in pushed:
            assert kind == "delta"
            state = apply(state, delta)
        assert set(children) <= node_lineages(state)
        assert elapsed < 1.0, f"pushed {elapsed:.3f} s after the commit"


def test_the_stream_resumes_from_the_clients_position(estate: Charter, fabric: Fabric) -> None:
    fan_out(estate, 1)
    with served(fabric) as url, httpx.Client(base_url=url, timeout=10) as client:
        with _stream(client) as stream:
            _, ident, state, _ = next(sse(stream.iter_lines()))
        # a client that has the head gets nothing until the next commit, then its delta
        with _stream(client, **{"last-event-id": ident}) as stream:
            fan_out(estate, 1)
            kind, _, delta, _ = next(sse(stream.iter_lines()))
        assert kind == "delta"
        assert delta["base"] == state["position"]
        assert delta["position"] > state["position"]


# -- the diff against the rules, over documents of the fabric's shape -----------------

_names = st.sampled_from(["agent:a", "agent:a/b", "agent:a/b/c", "agent:a/d", "agent:e"])
_values = st.one_of(st.none(), st.integers(-3, 3), st.text("ab<\x1b", max_size=3))


def _keyed(key: str, keys: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.dictionaries(keys, st.dictionaries(st.sampled_from("xyz"), _values)).map(
        lambda found: [{**fields, key: k} for k, fields in sorted(found.items())]
    )


_documents = st.fixed_dictionaries(
    {
        "position": st.integers(0, 9),
        "head": st.integers(0, 9),
        "live": st.booleans(),
        "tree": st.fixed_dictionaries(
            {"as_of": st.integers(0, 9), "nodes": _keyed("lineage", _names)}
        ),
        "budgets": st.fixed_dictionaries(
            {"as_of": st.integers(0, 9), "ledgers": _keyed("lineage", _names)}
        ),
        "slots": st.fixed_dictionaries({"cells": _keyed("cell", st.sampled_from("pqr"))}),
        "events": _keyed("position", st.integers(0, 9)).map(lambda items: items[::-1]),
        "burndown": _keyed("position", st.integers(0, 9)),
        "verdicts": st.dictionaries(_names, st.sampled_from(["revoked", "paused"])),
    }
)


@settings(max_examples=300, deadline=None)
@given(_documents, _documents)
def test_any_delta_rebuilds_the_newer_document(old: dict[str, Any], new: dict[str, Any]) -> None:
    delta = diff(old, new)
    assert delta is not None
    assert (delta["base"], delta["position"]) == (old["position"], new["position"])
    assert apply(old, json.loads(json.dumps(delta))) == new
    if old == new:
        assert (delta["set"], delta["upsert"], delta["drop"]) == ({}, {}, {})


def test_a_document_out_of_its_order_gets_no_delta() -> None:
    document = {"position": 1, "events": [{"position": 1}, {"position": 2}]}
    assert diff(document, {**document, "position": 2}) is None  # oldest first: no delta
    document["events"].reverse()
    assert diff(document, {**document, "position": 2}) is not None  # the control
