"""Shared fixtures: a real SQLite file and a real PostgreSQL database per test.

PostgreSQL is at ``CHARTER_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
Where it cannot be reached, its tests are skipped with the reason printed, except in
CI (``CI`` set) or with ``CHARTER_REQUIRE_POSTGRES=1``, where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest

PG_URL = os.environ.get("CHARTER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
PG_REQUIRED = bool(os.environ.get("CI")) or os.environ.get("CHARTER_REQUIRE_POSTGRES") == "1"


def _pg_admin() -> psycopg.Connection[tuple[object, ...]]:
    u = urlparse(PG_URL)
    return psycopg.connect(
        host=u.hostname,
        port=u.port or 5432,
        user=u.username or "postgres",
        password=u.password or "",
        dbname=u.path.lstrip("/"),
        autocommit=True,
        connect_timeout=3,
    )


_pg_error: str | None = None
try:
    _pg_admin().close()
except psycopg.Error as e:  # pragma: no cover - depends on the machine
    _pg_error = str(e).strip().splitlines()[0]


def pytest_report_header(config: pytest.Config) -> str:
    del config
    if _pg_error is None:
        return f"charter: PostgreSQL tests run against {PG_URL}"
    return f"charter: PostgreSQL UNAVAILABLE at {PG_URL}: {_pg_error}"


def require_postgres() -> None:
    """Fail (CI) or skip visibly (laptop) when PostgreSQL cannot be reached."""
    if _pg_error is None:
        return
    message = f"PostgreSQL not reachable at {PG_URL}: {_pg_error}"
    if PG_REQUIRED:
        pytest.fail(message + " (required in CI)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(autouse=True)
def _private_runtime_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL writers on one host share commits through files in the user's
    runtime directory (docs/decisions/0008): the test's own, not the developer's."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("run")))


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    require_postgres()
    name = f"charter_t_{uuid.uuid4().hex[:12]}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    u = urlparse(PG_URL)
    user = u.username or "postgres"
    try:
        yield f"postgresql://{user}@{u.hostname}:{u.port or 5432}/{name}"
    finally:
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'journal.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def journal_url(backend: str, request: pytest.FixtureRequest) -> str:
    """The contract suite's journal: one URL per backend, both real."""
    name = "sqlite_url" if backend == "sqlite" else "pg_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def charter_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("CHARTER_HOME", str(home))
    monkeypatch.delenv("CHARTER_DB", raising=False)
    return home
