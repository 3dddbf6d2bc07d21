"""Helpers for the MCP tests: a journal with a cell running its workers, and the
``charter mcp`` server as a subprocess (stdio or HTTP), reached by the official SDK."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from charter.app import Charter, Settings
from charter.core import KeyStore
from tests.runner._support import ROOT_DIR, make_cell, running
from tests.runner.conftest import initialise

# Each child runs this (on the cell the test runs): its stdout is its result.
WORKER = '{"argv": ["/bin/echo", "hello from a worker"]}'
# Within the estate's ceiling, per-worker memory at the sandbox minimum, and specific
# enough for the default gate (cost-benefit) to say yes.
COST = {
    "tokens": 20_000, "wall_ms": 120_000, "cpu_ms": 120_000, "mem_bytes": 2 << 28,
    "egress_bytes": 0,
}  # fmt: skip
INTENT: dict[str, Any] = {
    "width": 2,
    "objective": "echo one greeting from each of two workers to check the fan-out path",
    "estimated_cost": COST,
}


def env(home: Path, state_dir: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k not in ("CHARTER_DB", "CHARTER_HOME")},
        "CHARTER_HOME": str(home),
        "PYTHONPATH": str(ROOT_DIR),
        "CHARTER_SANDBOX_STATE": str(state_dir),
    }


def server_args(url: str, *extra: str) -> list[str]:
    return ["-m", "charter", "--db", url, "mcp", "--agent", "estate", "--worker", WORKER, *extra]


@contextmanager
def estate(url: str, home: Path, state_dir: Path) -> Iterator[Charter]:
    """A journal with the estate and its cell, the cell running on a thread."""
    initialise(url, home, processing=2, coordination=2).close()
    charter = Charter.open(url, keys=KeyStore(home), settings=Settings())
    with charter, running(make_cell(charter, None, state_dir)):
        yield charter


def token(url: str, home: Path, state_dir: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, "mcp", "token"],
        env=env(home, state_dir), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def _pump(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


@contextmanager
def http_endpoint(args: list[str], environ: dict[str, str]) -> Iterator[str]:
    """``python3 ARGS`` (a ``charter mcp --http`` command) as a subprocess: the endpoint
    URL it says it serves, once it listens; the server is stopped afterwards."""
    process = subprocess.Popen(
        [sys.executable, *args], env=environ, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None
    threading.Thread(target=_pump, args=(process.stderr, lines), daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("charter mcp --http did not say where it serves") from None
            if "serving http://" in line:
                yield line.split("serving ", 1)[1].strip()
                break
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def http_server(url: str, home: Path, state_dir: Path, *extra: str) -> Iterator[str]:
    """``charter mcp --http 127.0.0.1:0`` for the estate: its endpoint URL."""
    with http_endpoint(
        server_args(url, "--http", "127.0.0.1:0", *extra), env(home, state_dir)
    ) as endpoint:
        yield endpoint
