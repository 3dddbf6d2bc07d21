"""The page's JSON endpoints with starlette's TestClient, on SQLite and PostgreSQL:
every answer carries the position it reflects, as-of answers the earlier state, worker
text is escaped, nothing but GET is served, and the token is required where it must be
(each refusal beside its positive control). The stream: tests/serve/test_stream.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

from starlette.testclient import TestClient

from charter.app import Charter
from charter.mcp import issue_token_file
from charter.serve import COOKIE, Fabric, build_app, session_value
from tests.serve._support import HOSTILE, fan_out, head, node_lineages

LOOPBACK = "http://127.0.0.1"


def test_every_endpoint_carries_its_position(estate: Charter, fabric: Fabric) -> None:
    children = fan_out(estate, 3)
    with TestClient(build_app(fabric), base_url=LOOPBACK) as client:
        now = head(estate)
        assert client.get("/api/head").json() == {"position": now}
        data = client.get("/api/fabric").json()
        assert data["position"] == now
        assert data["head"] == now
        assert data["tree"]["as_of"] == data["budgets"]["as_of"] == data["slots"]["as_of"] == now
        assert set(children) <= node_lineages(data)
        assert data["live"] is True
        cells = {c["cell"]: c for c in data["slots"]["cells"]}
        assert cells["local"]["slots"]["processing"]["cap"] == 2
        assert data["burndown"][-1]["position"] == now
        roots = data["burndown"][-1]["roots"]
        assert (
            roots["agent:estate"]["remaining"]["tokens"]
            < roots["agent:estate"]["allocation"]["tokens"]
        )
        past = client.get("/api/fabric", params={"as_of": 3}).json()
        assert past["position"] == 3
        assert past["live"] is False


def test_as_of_answers_the_earlier_state(estate: Charter, fabric: Fabric) -> None:
    first = fan_out(estate, 2)
    between = head(estate)
    second = fan_out(estate, 3)
    with TestClient(build_app(fabric), base_url=LOOPBACK) as client:
        now = client.get("/api/fabric").json()
        then = client.get("/api/fabric", params={"as_of": between}).json()
    assert set(first + second) <= node_lineages(now)
    assert then["position"] == between
    assert set(first) <= node_lineages(then)
    assert not set(second) & node_lineages(then)  # the later fan-out is not there yet
    assert all(p["position"] <= between for p in then["burndown"])
    assert all(e["position"] <= between for e in then["events"])


def test_a_bad_or_future_position_is_refused(estate: Charter, fabric: Fabric) -> None:
    with TestClient(build_app(fabric), base_url=LOOPBACK) as client:
        beyond = head(estate) + 10
        for bad in ("-1", "x", "٣", str(beyond)):
            answer = client.get("/api/fabric", params={"as_of": bad})
            assert answer.status_code == 400, bad
            assert "error" in answer.json()
        assert client.get("/api/fabric", params={"as_of": "1"}).status_code == 200  # control


def test_worker_text_is_escaped(estate: Charter, fabric: Fabric) -> None:
    [child] = fan_out(estate, 1, objective=HOSTILE)
    estate.revoke(child, reason=HOSTILE)
    with TestClient(build_app(fabric), base_url=LOOPBACK) as client:
        data = client.get("/api/fabric").json()
    gate = next(e for e in data["events"] if e["type"] == "GateDecided")
    revoked = next(e for e in data["events"] if e["type"] == "LineageRevoked")
    assert revoked["lineage"] == child
    assert data["verdicts"] == {child: "revoked"}  # the tree shows it on the lineage
    for text in (gate["objective"], revoked["reason"]):
        # terminal and bidi control characters are shown as escapes, never sent raw
        assert "\x1b" not in text
        assert "\u202e" not in text
        assert "\\x1b[31m" in text
        assert "<img" in text  # markup stays text; the page never parses it
    raw = json.dumps(data)
    assert "\\u001b" not in raw


def test_only_get_is_served(estate: Charter, fabric: Fabric) -> None:
    before = head(estate)
    with TestClient(build_app(fabric), base_url=LOOPBACK) as client:
        for path in ("/", "/api/head", "/api/fabric", "/api/stream", "/static/app.js", "/nope"):
            for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"):
                refused = client.request(method, path)
                assert refused.status_code == 405, (method, path)
                assert refused.headers["allow"] == "GET, HEAD"
            if path not in ("/api/stream", "/nope"):
                assert client.get(path).status_code == 200  # the control: GET is served
    assert head(estate) == before  # nothing was written


def test_without_a_token_only_loopback_hosts_are_served(fabric: Fabric) -> None:
    app = build_app(fabric)
    with TestClient(app, base_url="http://attacker.example") as client:
        assert client.get("/api/head").status_code == 421  # a rebound name is refused
    for host in ("http://127.0.0.1:8766", "http://localhost", "http://[::1]:1"):
        with TestClient(app, base_url=host) as client:
            assert client.get("/api/head").status_code == 200, host


def test_a_token_is_needed_when_there_is_one(
    estate: Charter, fabric: Fabric, tmp_path: Path
) -> None:
    token_file = tmp_path / "serve-token"
    token = issue_token_file(token_file)
    assert os.stat(token_file).st_mode & 0o777 == 0o600
    app = build_app(fabric, token_file=token_file)
    with TestClient(app, base_url="http://192.0.2.10:8766") as client:
        for path in ("/", "/api/head", "/api/fabric", "/static/app.js"):
            assert client.get(path).status_code == 401, path
        wrong = {"authorization": "Bearer " + "0" * len(token)}
        assert client.get("/api/head", headers=wrong).status_code == 401
        assert client.get("/", params={"token": "0" * len(token)}).status_code == 401
        client.cookies.set(COOKIE, token)  # the token itself is not a session
        assert client.get("/api/head").status_code == 401
        client.cookies.clear()
        # the controls: the bearer token, and the page's ?token= that sets a session
        bearer = {"authorization": f"Bearer {token}"}
        assert client.get("/api/head", headers=bearer).json() == {"position": head(estate)}
        opened = client.get("/", params={"token": token}, follow_redirects=False)
        assert opened.status_code == 303
        assert opened.headers["location"] == "/"
        cookie = opened.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie
        assert token not in cookie
        assert session_value(token) in cookie
        assert client.get("/api/fabric").status_code == 200  # the session cookie serves
        assert client.get("/").status_code == 200
        # a new token ends the session at once
        issue_token_file(token_file)
        assert client.get("/api/fabric").status_code == 401
        # a token file others may read is no token at all
        fresh = issue_token_file(token_file)
        os.chmod(token_file, 0o644)
        readable = client.get("/api/head", headers={"authorization": f"Bearer {fresh}"})
        assert readable.status_code == 401
