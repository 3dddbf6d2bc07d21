"""What the benchmarks share: a nearest-rank percentile and a scratch PostgreSQL
database (made for one measurement, dropped afterwards)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from charter.ledger import resolve_location

__all__ = ["percentile", "pg_conninfo", "scratch_database"]

ROOT = Path(__file__).resolve().parents[1]


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A measured run's environment: this tree on the path, ``extra``, and bytecode
    written and read as an installed package's is (on a PYTHONDONTWRITEBYTECODE host
    every start would compile every module, which no installed charter does)."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**base, "PYTHONPATH": str(ROOT), **(extra or {})}


def percentile(samples: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``samples`` (0 <= q <= 1)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def pg_conninfo(url: str) -> dict[str, Any]:
    """psycopg connection keywords for a ``postgresql://`` URL (Charter's own parser)."""
    return dict(resolve_location(url).conninfo or {})


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A new, empty database next to ``admin_url``'s; yields its URL, then drops it."""
    info = pg_conninfo(admin_url)
    name = f"charter_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**info, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://{info['user']}@{info['host']}:{info['port']}/{name}"
    finally:
        with psycopg.connect(**info, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
