"""Benchmark: a spawn through ``charter mcp`` (the official SDK's client calling the
intent-only tool, round trip) against the Python API's ``Charter.spawn`` of the same
width, alternated in the same run on the same journal.

    python3 bench/mcp_spawn.py [--widths 1,100] [--runs 30] [--transport stdio|http|both]
        [--backend sqlite|postgres] [--pg URL]

The server runs as ``python3 -m charter mcp`` in a subprocess (over stdio, or over
streamable HTTP on loopback with the operator's token) with its own composition root;
the API spawns in this process with another, on the same journal and the same agent.
Children are minted and leased only (no cell runs them): what is measured is the
spawn, not a sandbox. Prints p50/p90 of each and the ratio MCP / API per width.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._support import percentile, scratch_database
from charter.app import CellSetup, Charter, Settings
from charter.authority import SpawnIntent
from charter.budgets import FabricCeilings
from charter.control import Ceiling
from charter.core import Budget, KeyStore
from tests.mcp._support import http_endpoint

ROOT = Path(__file__).resolve().parents[1]
CEILING = Budget.parse("tokens=1000000M,wall=100000h,cpu=100000h,mem=100000GiB,egress=100GB")
POPULATION = 10**9


def intent(width: int) -> dict[str, Any]:
    return {
        "width": width,
        "objective": "mint workers for the MCP round-trip benchmark, one batch per call",
        "estimated_cost": {
            "tokens": 50_000 * width, "wall_ms": 60_000 * width, "cpu_ms": 60_000 * width,
            "mem_bytes": (1 << 28) * width, "egress_bytes": 0,
        },
    }  # fmt: skip


def _env(home: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k != "CHARTER_DB"},
        "CHARTER_HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "CHARTER_POPULATION_CEILING": str(POPULATION),
    }


@contextlib.contextmanager
def _http(url: str, home: Path) -> Iterator[tuple[str, str]]:
    token = subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, "mcp", "token"],
        env=_env(home), capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    args = ["-m", "charter", "--db", url, "mcp", "--agent", "bench", "--http", "127.0.0.1:0"]
    with http_endpoint(args, _env(home)) as endpoint:
        yield endpoint, token


async def _measure(
    client: Client, charter: Charter, widths: list[int], runs: int
) -> dict[int, dict[str, list[float]]]:
    out: dict[int, dict[str, list[float]]] = {w: {"mcp": [], "api": []} for w in widths}
    for width in widths:  # one warm-up of each first
        await client.call_tool("spawn", intent(width))
        charter.spawn("agent:bench", SpawnIntent.model_validate(intent(width)))
    for run in range(runs):
        for width in widths:
            # Alternated A-B, B-A: neither path always follows the other's commit.
            for path in ("mcp", "api") if run % 2 == 0 else ("api", "mcp"):
                if path == "mcp":
                    started = time.perf_counter()
                    result = await client.call_tool("spawn", intent(width))
                    out[width]["mcp"].append((time.perf_counter() - started) * 1000)
                    if result.is_error:
                        raise SystemExit(f"the MCP spawn was refused: {result.structured_content}")
                else:
                    body = SpawnIntent.model_validate(intent(width))
                    started = time.perf_counter()
                    charter.spawn("agent:bench", body)
                    out[width]["api"].append((time.perf_counter() - started) * 1000)
    return out


def _report(transport: str, results: dict[int, dict[str, list[float]]]) -> None:
    for width, both in results.items():
        mcp, api = both["mcp"], both["api"]
        ratio = percentile(mcp, 0.5) / percentile(api, 0.5)
        print(
            f"{transport:5} width {width:5}: MCP p50 {percentile(mcp, 0.5):7.1f} ms "
            f"p90 {percentile(mcp, 0.9):7.1f} | API p50 {percentile(api, 0.5):7.1f} ms "
            f"p90 {percentile(api, 0.9):7.1f} | MCP/API p50 {ratio:.2f}x "
            f"(+{percentile(mcp, 0.5) - percentile(api, 0.5):.1f} ms)"
        )


def run(url: str, widths: list[int], runs: int, transports: list[str]) -> None:
    home = Path(tempfile.mkdtemp(prefix="charter-bench-mcp-"))
    try:
        settings = Settings(ceilings=FabricCeilings(population=POPULATION))
        charter, _ = Charter.initialise(
            url, root="bench", ceiling=Ceiling(budget=CEILING, depth=4, fanout=10**6),
            cell=CellSetup(cores=2), keys=KeyStore(home), settings=settings,
        )  # fmt: skip
        with charter:
            for transport in transports:
                if transport == "stdio":
                    params = StdioServerParameters(
                        command=sys.executable,
                        args=["-m", "charter", "--db", url, "mcp", "--agent", "bench"],
                        env=_env(home),
                    )

                    async def stdio(
                        params: StdioServerParameters = params,
                    ) -> dict[int, dict[str, list[float]]]:
                        async with Client(params) as client:
                            return await _measure(client, charter, widths, runs)

                    _report("stdio", anyio.run(stdio))
                else:
                    with _http(url, home) as (endpoint, token):

                        async def http() -> dict[int, dict[str, list[float]]]:
                            auth = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
                            transport = streamable_http_client(endpoint, http_client=auth)
                            async with auth, Client(transport) as client:
                                return await _measure(client, charter, widths, runs)

                        _report("http", anyio.run(http))
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="1,100")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--transport", choices=["stdio", "http", "both"], default="both")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    transports = ["stdio", "http"] if args.transport == "both" else [args.transport]
    print(f"load average: {os.getloadavg()}")
    if args.backend == "postgres":
        with scratch_database(args.pg) as url:
            run(url, widths, args.runs, transports)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="charter-bench-mcp-db-"))
        try:
            run(f"sqlite:///{scratch / 'journal.db'}", widths, args.runs, transports)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
