"""Helpers for the page's tests: an estate journal, a fan-out, and the page served by
uvicorn on a thread (a real socket on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from charter.app import Charter
from charter.authority import SpawnIntent
from charter.core import Budget
from charter.serve import Fabric, build_app

COST = Budget(tokens=20_000, wall_ms=120_000, cpu_ms=120_000, mem_bytes=2 << 28, egress_bytes=0)
# enough per worker for the default gate to say yes to a fan-out of 100
WIDE = Budget(
    tokens=250_000, wall_ms=1_200_000, cpu_ms=1_200_000, mem_bytes=2 << 30, egress_bytes=0
)
HOSTILE = '<img src=x onerror="window.__pwned=1"> \x1b[31mred\x1b[0m \u202eevil'


def fan_out(charter: Charter, width: int, objective: str = "", cost: Budget = COST) -> list[str]:
    """A fan-out of ``width`` under the estate; the children's lineages."""
    result = charter.spawn(
        "agent:estate",
        SpawnIntent(
            width=width,
            objective=objective or f"check the page shows each of {width} workers of a fan-out",
            estimated_cost=cost,
        ),
    )
    return [str(child.lineage) for child in result.children]


def head(charter: Charter) -> int:
    found = charter.journal.head()
    return 0 if found is None else found[0]


@contextmanager
def served(fabric: Fabric, *, token_file: Path | None = None) -> Iterator[str]:
    """The page on a free port of 127.0.0.1 (its base URL), stopped afterwards."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    app = build_app(fabric, token_file=token_file)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the page's server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()


def node_lineages(data: dict[str, Any]) -> set[str]:
    return {n["lineage"] for n in data["tree"]["nodes"]}


def sse(lines: Iterable[str]) -> Iterator[tuple[str, str, dict[str, Any], int]]:
    """The events of a server-sent stream's lines: (event, id, the data's JSON, the
    data's length in bytes), comments and data-less blocks (``retry:``) passed over."""
    event: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "data" in event:
                data = event["data"]
                yield (
                    event.get("event", "message"),
                    event.get("id", ""),
                    json.loads(data),
                    len(data.encode()),
                )
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")
