"""``charter mcp`` reached by the official MCP SDK's client: over stdio (the server as
a subprocess) on both journal backends, and over streamable HTTP, where a client
without the operator's token (none, a wrong one, a rotated-out one) is refused and
the same client with it is served."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.mcp._scenario import fan_out_wait_and_read
from tests.mcp._support import env, estate, http_server, server_args, token
from tests.runner.conftest import initialise

_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_over_stdio_a_client_spawns_waits_and_reads_its_budget(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with estate(journal_url, home, state_dir) as charter:
        params = StdioServerParameters(
            command=sys.executable, args=server_args(journal_url), env=env(home, state_dir)
        )

        async def scenario() -> None:
            async with Client(params) as client:
                await fan_out_wait_and_read(client, charter)

        anyio.run(scenario)


def test_over_stdio_a_home_others_may_read_is_no_operator(
    sqlite_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """Over stdio the operator is whoever may read the home: a home others may read is
    refused before anything is served; the same home made private is served."""
    home = tmp_path / "home"
    initialise(sqlite_url, home).close()
    args = [sys.executable, *server_args(sqlite_url)]
    home.chmod(0o755)
    refused = subprocess.run(
        args, env=env(home, state_dir), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "not private to this user" in refused.stderr
    assert refused.stdout == ""  # nothing served
    home.chmod(0o700)  # the control: private, it serves (and ends at stdin's end)
    served = subprocess.run(
        args, env=env(home, state_dir), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for e in group.exceptions for leaf in _leaves(e)]
    return [group]


def _post(url: str, headers: dict[str, str]) -> int:
    response = httpx2.post(url, json=_INITIALIZE, headers=_HEADERS | headers, timeout=30)
    return response.status_code


def test_over_http_only_the_operator_token_is_served(
    journal_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    with estate(journal_url, home, state_dir) as charter:
        good = token(journal_url, home, state_dir)
        assert (home / "mcp-token").stat().st_mode & 0o777 == 0o600
        with http_server(journal_url, home, state_dir) as url:
            assert _post(url, {}) == 401  # no identity
            assert _post(url, {"Authorization": "Bearer " + "0" * 64}) == 401
            assert _post(url, {"Authorization": "Bearer " + good[:-1]}) == 401
            assert _post(url, {"Authorization": good}) == 401  # not a bearer header
            assert _post(url, {"Authorization": "Bearer " + good}) == 200  # the control

            async def refused() -> None:
                async with Client(streamable_http_client(url)) as client:
                    await client.list_tools()

            with pytest.raises(BaseExceptionGroup) as no_token:
                anyio.run(refused)
            assert any(isinstance(e, MCPError) for e in _leaves(no_token.value)), no_token.value

            async def scenario() -> None:
                http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {good}"})
                async with http, Client(streamable_http_client(url, http_client=http)) as client:
                    await fan_out_wait_and_read(client, charter)

            anyio.run(scenario)

            # A new token replaces the old one at once; a removed one refuses everyone.
            newer = token(journal_url, home, state_dir)
            assert _post(url, {"Authorization": "Bearer " + good}) == 401
            assert _post(url, {"Authorization": "Bearer " + newer}) == 200
            os.unlink(home / "mcp-token")
            assert _post(url, {"Authorization": "Bearer " + newer}) == 401


def test_http_needs_a_token_and_loopback(sqlite_url: str, tmp_path: Path, state_dir: Path) -> None:
    home = tmp_path / "home"
    initialise(sqlite_url, home).close()
    for extra, said in (
        (("--http", "127.0.0.1:0"), "charter mcp token"),  # no token issued yet
        (("--http", "0.0.0.0:0"), "not a loopback address"),
    ):
        done = subprocess.run(
            [sys.executable, *server_args(sqlite_url, *extra)], env=env(home, state_dir),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode != 0
        assert said in done.stderr, done.stderr
