"""Where a journal lives: ``--db`` / ``CHARTER_DB`` URLs or the embedded default, and the
eventsourcing settings that open it (schema is never created from here)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlparse

from charter.core.errors import BadInputError
from charter.core.home import charter_home
from charter.ledger.errors import UnknownSchemeError

__all__ = ["Location", "resolve_location"]


@dataclass(frozen=True)
class Location:
    """Where a journal lives, parsed from a URL (or the embedded default)."""

    kind: str  # "sqlite" | "postgresql"
    display: str
    path: Path | None = None
    conninfo: Mapping[str, Any] | None = None

    def app_env(self) -> dict[str, str]:
        """eventsourcing environment for this location (schema is never created here)."""
        if self.kind == "sqlite":
            env = {
                "PERSISTENCE_MODULE": "charter.ledger._sqlite:ChainedSQLiteFactory",
                "SQLITE_DBNAME": str(self.path),
                "SQLITE_LOCK_TIMEOUT": "30",
                # The process variant: the same chained insert, plus tracking positions.
                "APPLICATION_RECORDER_TOPIC": (
                    "charter.ledger._sqlite:ChainedSQLiteProcessRecorder"
                ),
                "PROCESS_RECORDER_TOPIC": "charter.ledger._sqlite:ChainedSQLiteProcessRecorder",
            }
        else:
            info = dict(self.conninfo or {})
            env = {
                "PERSISTENCE_MODULE": "charter.ledger._postgres:ChainedPostgresFactory",
                "POSTGRES_DBNAME": str(info["dbname"]),
                "POSTGRES_HOST": str(info["host"]),
                "POSTGRES_PORT": str(info["port"]),
                "POSTGRES_USER": str(info["user"]),
                "POSTGRES_PASSWORD": str(info.get("password") or ""),
                "POSTGRES_POOL_SIZE": "1",
                "POSTGRES_MAX_OVERFLOW": "2",
                "POSTGRES_CONNECT_TIMEOUT": "5",
                # A writer stalled while holding the table lock must not block every
                # other writer without limit: they give up after this many seconds with
                # a clear error (SQLite's busy timeout above is the same 30 s).
                "POSTGRES_LOCK_TIMEOUT": "30",
                # … and a statement that runs this long (a writer stalled inside one) is
                # cancelled, so nothing waits on it without limit either.
                "POSTGRES_STATEMENT_TIMEOUT": "60",
                "POSTGRES_CONNINFO_EXTRA": json.dumps(
                    {k: str(v) for k, v in info.items() if k not in _BASE_KEYS}, sort_keys=True
                ),
                "POSTGRES_ENABLE_DB_FUNCTIONS": "n",
                "APPLICATION_RECORDER_TOPIC": (
                    "charter.ledger._postgres:ChainedPostgresProcessRecorder"
                ),
                "PROCESS_RECORDER_TOPIC": (
                    "charter.ledger._postgres:ChainedPostgresProcessRecorder"
                ),
            }
        from charter.ledger._app import JournalApplication  # eventsourcing: to write only

        env["CREATE_TABLE"] = "no"
        # The library looks up CHARTER_<KEY> before <KEY>; pin both so a stray
        # variable in the caller's environment cannot redirect the journal.
        return env | {f"{JournalApplication.name.upper()}_{k}": v for k, v in env.items()}


# The connection parameters taken from the URL's host part; the query may add any of
# _URL_PARAMETERS (libpq's own names), which are passed to the driver as they are.
_BASE_KEYS = frozenset({"host", "port", "user", "password", "dbname"})
_URL_PARAMETERS = frozenset(
    {
        "application_name",
        "channel_binding",
        "gssencmode",
        "keepalives",
        "keepalives_count",
        "keepalives_idle",
        "keepalives_interval",
        "krbsrvname",
        "options",
        "passfile",
        "requirepeer",
        "service",
        "sslcert",
        "sslcompression",
        "sslcrl",
        "sslkey",
        "sslmode",
        "sslpassword",
        "sslrootcert",
        "sslsni",
        "target_session_attrs",
        "tcp_user_timeout",
    }
)
_USAGE = "postgresql://USER@HOST:PORT/DBNAME[?sslmode=require&…]"


def _postgres_location(url: str) -> Location:
    """A PostgreSQL URL, every malformed part of it bad input (never a traceback), its
    query parameters kept for the driver (never silently dropped)."""
    try:
        parsed = urlparse(url)
        port = parsed.port or 5432
        host = parsed.hostname
    except ValueError as e:  # a port that is not a number or out of range, bad [IPv6]
        raise BadInputError(f"journal URL {url!r} is malformed ({e}); write {_USAGE}") from None
    dbname = unquote(parsed.path.lstrip("/"))
    if not dbname or not host:
        raise BadInputError(f"journal URL {url!r} needs a host and a database: {_USAGE}")
    info: dict[str, Any] = {
        "host": host,
        "port": port,
        "user": unquote(parsed.username or os.environ.get("USER") or "postgres"),
        "password": unquote(parsed.password or ""),
        "dbname": dbname,
    }
    try:
        query = parse_qsl(parsed.query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise BadInputError(f"journal URL {url!r} has a malformed query; write {_USAGE}") from None
    for key, value in query:
        if key not in _URL_PARAMETERS:
            raise BadInputError(
                f"journal URL parameter {key!r} is not one Charter passes to PostgreSQL; "
                f"use one of {', '.join(sorted(_URL_PARAMETERS))}"
            )
        info[key] = value
    shown = f"postgresql://{info['user']}@{host}:{port}/{dbname}"
    if query:
        shown += "?" + "&".join(f"{k}={v}" for k, v in query if k != "sslpassword")
    return Location("postgresql", shown, conninfo=info)


def resolve_location(url: str | Location | None = None) -> Location:
    """``--db``, else ``CHARTER_DB``, else ``$CHARTER_HOME/journal.db``. A Location
    already resolved is returned as it is (its ``display`` omits the password, so it
    is never parsed back into one)."""
    if isinstance(url, Location):
        return url
    url = url or os.environ.get("CHARTER_DB") or None
    if url is None:
        path = charter_home() / "journal.db"
        return Location("sqlite", f"sqlite:///{path}", path=path)
    try:
        parsed = urlparse(url)
    except ValueError as e:  # an unclosed [IPv6] host, say
        raise BadInputError(f"journal URL {url!r} is malformed ({e})") from None
    if parsed.scheme == "sqlite":
        raw = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if not raw:
            raise BadInputError(
                f"journal URL {url!r} has no path; write sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db"
            )
        path = Path(unquote(raw)).absolute()
        return Location("sqlite", f"sqlite:///{path}", path=path)
    if parsed.scheme in ("postgresql", "postgres"):
        return _postgres_location(url)
    raise UnknownSchemeError(
        f"unknown journal URL scheme {parsed.scheme or url!r}; use sqlite:///PATH or "
        "postgresql://USER@HOST:PORT/DBNAME"
    )
