# SQL text is built only from module constants and a prefix checked by check_prefix,
# never from other input (the same reason charter/ledger/_sqlite.py ignores S608).
# ruff: noqa: S608
"""The projection tables and the SQL both backends share (driver code lives in
``_sqlite`` / ``_postgres``; this module imports no driver).

Statements are written with ``?`` placeholders and ``{p}`` for the table prefix; the
PostgreSQL store turns ``?`` into ``%s``. Table names come only from the prefix, which
is checked against ``_PREFIX`` when the store is made, never from other input.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from charter.core.errors import BadInputError
from charter.projections._fold import (
    AXES,
    CELL_COLUMNS,
    CLAIM_COLUMNS,
    LEDGER_COLUMNS,
    NODE_COLUMNS,
    QUEUE_COLUMNS,
    SAMPLE_COLUMNS,
    SLOT_COLUMNS,
    WORKER_COLUMNS,
    Changes,
)

__all__ = ["NEWEST_TABLE", "ProjectionStore", "check_prefix"]

_PREFIX = re.compile(r"^[a-z][a-z0-9_]{0,30}$")

_DDL = [
    "CREATE TABLE IF NOT EXISTS {p}_ledgers (lineage TEXT NOT NULL, "
    "valid_from BIGINT NOT NULL, valid_to BIGINT, parent TEXT, "
    + ", ".join(f"alloc_{a} BIGINT NOT NULL" for a in AXES)
    + ", expires_at_ms BIGINT, released_at_ms BIGINT, "
    + ", ".join(f"spent_{a} BIGINT NOT NULL" for a in AXES)
    + ", exhausted SMALLINT NOT NULL, PRIMARY KEY (lineage, valid_from), "
    "CHECK (valid_to IS NULL OR valid_to > valid_from))",
    # At most one current version per key: the database enforces what the fold keeps.
    "CREATE UNIQUE INDEX IF NOT EXISTS {p}_ledgers_current ON {p}_ledgers (lineage) "
    "WHERE valid_to IS NULL",
    "CREATE TABLE IF NOT EXISTS {p}_cells (cell TEXT NOT NULL, valid_from BIGINT NOT NULL, "
    "valid_to BIGINT, caps TEXT NOT NULL, cores BIGINT NOT NULL, "
    "failover_reserve BIGINT NOT NULL, PRIMARY KEY (cell, valid_from), "
    "CHECK (valid_to IS NULL OR valid_to > valid_from))",
    "CREATE UNIQUE INDEX IF NOT EXISTS {p}_cells_current ON {p}_cells (cell) "
    "WHERE valid_to IS NULL",
    "CREATE TABLE IF NOT EXISTS {p}_slots (cell TEXT NOT NULL, resource TEXT NOT NULL, "
    "lineage TEXT NOT NULL, valid_from BIGINT NOT NULL, valid_to BIGINT, "
    "PRIMARY KEY (cell, resource, lineage, valid_from), "
    "CHECK (valid_to IS NULL OR valid_to > valid_from))",
    "CREATE UNIQUE INDEX IF NOT EXISTS {p}_slots_current ON {p}_slots "
    "(cell, resource, lineage) WHERE valid_to IS NULL",
    "CREATE TABLE IF NOT EXISTS {p}_nodes (lineage TEXT PRIMARY KEY, parent TEXT, "
    "depth BIGINT NOT NULL, kind TEXT NOT NULL, position BIGINT NOT NULL, fanout TEXT)",
    "CREATE TABLE IF NOT EXISTS {p}_counts (type TEXT PRIMARY KEY, n BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {p}_workers (lineage TEXT NOT NULL, "
    "valid_from BIGINT NOT NULL, valid_to BIGINT, cell TEXT NOT NULL, status TEXT NOT NULL, "
    "PRIMARY KEY (lineage, valid_from), CHECK (valid_to IS NULL OR valid_to > valid_from))",
    "CREATE UNIQUE INDEX IF NOT EXISTS {p}_workers_current ON {p}_workers (lineage) "
    "WHERE valid_to IS NULL",
    "CREATE TABLE IF NOT EXISTS {p}_queue (cell TEXT NOT NULL, resource TEXT NOT NULL, "
    "lineage TEXT NOT NULL, valid_from BIGINT NOT NULL, valid_to BIGINT, "
    "seq BIGINT NOT NULL, PRIMARY KEY (cell, resource, lineage, valid_from), "
    "CHECK (valid_to IS NULL OR valid_to > valid_from))",
    "CREATE UNIQUE INDEX IF NOT EXISTS {p}_queue_current ON {p}_queue "
    "(cell, resource, lineage) WHERE valid_to IS NULL",
    "CREATE TABLE IF NOT EXISTS {p}_claims (cell TEXT NOT NULL, valid_from BIGINT NOT NULL, "
    "valid_to BIGINT, incarnation BIGINT NOT NULL, until_ms BIGINT, "
    "PRIMARY KEY (cell, valid_from), CHECK (valid_to IS NULL OR valid_to > valid_from))",
    "CREATE UNIQUE INDEX IF NOT EXISTS {p}_claims_current ON {p}_claims (cell) "
    "WHERE valid_to IS NULL",
    "CREATE TABLE IF NOT EXISTS {p}_samples (lineage TEXT NOT NULL, "
    "valid_from BIGINT NOT NULL, valid_to BIGINT, wall_ms BIGINT NOT NULL, "
    "cpu_ms BIGINT NOT NULL, memory_bytes BIGINT NOT NULL, "
    "PRIMARY KEY (lineage, valid_from), CHECK (valid_to IS NULL OR valid_to > valid_from))",
    "CREATE UNIQUE INDEX IF NOT EXISTS {p}_samples_current ON {p}_samples (lineage) "
    "WHERE valid_to IS NULL",
]

_TABLES = (
    "ledgers", "cells", "slots", "nodes", "counts", "workers", "queue", "claims", "samples"
)  # fmt: skip
# The table added last: a projection made before it existed is rebuilt once on open.
NEWEST_TABLE = "samples"

_AS_OF = "valid_from <= ? AND (valid_to IS NULL OR valid_to > ?)"
# Lineage paths below L sort between "L/" and "L0" ('0' follows '/'): no LIKE escaping.
_SUBTREE = "(lineage = ? OR (lineage > ? AND lineage < ?))"


def check_prefix(prefix: str) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise BadInputError(
            f"projection name {prefix!r} must be 1-31 lower-case letters, digits or '_', "
            "starting with a letter"
        )
    return prefix


def subtree_params(lineage: str) -> tuple[str, str, str]:
    return (lineage, lineage + "/", lineage + "0")


def _insert(table: str, columns: Sequence[str], *, ignore: bool = False) -> str:
    marks = ", ".join("?" for _ in columns)
    tail = " ON CONFLICT DO NOTHING" if ignore else ""
    return "INSERT INTO {p}_" + table + f" ({', '.join(columns)}) VALUES ({marks}){tail}"


_STATEMENTS = {
    "ledger_insert": _insert("ledgers", LEDGER_COLUMNS),
    "ledger_close": "UPDATE {p}_ledgers SET valid_to = ? WHERE lineage = ? AND valid_to IS NULL",
    "cell_insert": _insert("cells", CELL_COLUMNS),
    "cell_close": "UPDATE {p}_cells SET valid_to = ? WHERE cell = ? AND valid_to IS NULL",
    "slot_insert": _insert("slots", SLOT_COLUMNS),
    "slot_close": "UPDATE {p}_slots SET valid_to = ? WHERE cell = ? AND resource = ? "
    "AND lineage = ? AND valid_to IS NULL",
    "node_insert": _insert("nodes", NODE_COLUMNS, ignore=True),
    "count": "INSERT INTO {p}_counts (type, n) VALUES (?, ?) ON CONFLICT (type) "
    "DO UPDATE SET n = {p}_counts.n + excluded.n",
    "current_ledgers": "SELECT "
    + ", ".join(LEDGER_COLUMNS)
    + " FROM {p}_ledgers WHERE valid_to IS NULL",
    "current_cells": "SELECT " + ", ".join(CELL_COLUMNS) + " FROM {p}_cells WHERE valid_to IS NULL",
    "current_slots": "SELECT " + ", ".join(SLOT_COLUMNS) + " FROM {p}_slots WHERE valid_to IS NULL",
    "ledgers_as_of": "SELECT " + ", ".join(LEDGER_COLUMNS) + " FROM {p}_ledgers WHERE " + _AS_OF,
    "cells_as_of": "SELECT " + ", ".join(CELL_COLUMNS) + " FROM {p}_cells WHERE " + _AS_OF,
    "slots_as_of": "SELECT " + ", ".join(SLOT_COLUMNS) + " FROM {p}_slots WHERE " + _AS_OF,
    "nodes_as_of": "SELECT " + ", ".join(NODE_COLUMNS) + " FROM {p}_nodes WHERE position <= ?",
    "counts": "SELECT type, n FROM {p}_counts",
    "worker_insert": _insert("workers", WORKER_COLUMNS),
    "worker_close": "UPDATE {p}_workers SET valid_to = ? WHERE lineage = ? AND valid_to IS NULL",
    "queue_insert": _insert("queue", QUEUE_COLUMNS),
    "queue_close": "UPDATE {p}_queue SET valid_to = ? WHERE cell = ? AND resource = ? "
    "AND lineage = ? AND valid_to IS NULL",
    "current_workers": "SELECT "
    + ", ".join(WORKER_COLUMNS)
    + " FROM {p}_workers WHERE valid_to IS NULL",
    "current_queue": "SELECT "
    + ", ".join(QUEUE_COLUMNS)
    + " FROM {p}_queue WHERE valid_to IS NULL",
    "workers_as_of": "SELECT " + ", ".join(WORKER_COLUMNS) + " FROM {p}_workers WHERE " + _AS_OF,
    "queue_as_of": "SELECT " + ", ".join(QUEUE_COLUMNS) + " FROM {p}_queue WHERE " + _AS_OF,
    "claim_insert": _insert("claims", CLAIM_COLUMNS),
    "claim_close": "UPDATE {p}_claims SET valid_to = ? WHERE cell = ? AND valid_to IS NULL",
    "current_claims": "SELECT "
    + ", ".join(CLAIM_COLUMNS)
    + " FROM {p}_claims WHERE valid_to IS NULL",
    "claims_as_of": "SELECT " + ", ".join(CLAIM_COLUMNS) + " FROM {p}_claims WHERE " + _AS_OF,
    "sample_insert": _insert("samples", SAMPLE_COLUMNS),
    "sample_close": "UPDATE {p}_samples SET valid_to = ? WHERE lineage = ? AND valid_to IS NULL",
    "current_samples": "SELECT "
    + ", ".join(SAMPLE_COLUMNS)
    + " FROM {p}_samples WHERE valid_to IS NULL",
    "samples_as_of": "SELECT " + ", ".join(SAMPLE_COLUMNS) + " FROM {p}_samples WHERE " + _AS_OF,
}


class ProjectionStore(ABC):
    """The projection tables of one journal database, under one prefix."""

    #: the journal's tracking table (the library's single-row tracking)
    tracking_table: str = "tracking"
    #: appended to each CREATE TABLE (SQLite stores its tables clustered by primary key)
    table_options: str = ""
    #: whether a rebuild drops the indexes while it inserts (SQLite: readers read their
    #: WAL snapshot; PostgreSQL's DROP INDEX would lock readers out until the commit)
    rebuild_drops_indexes: bool = False

    def __init__(self, prefix: str, tracking_name: str) -> None:
        self.prefix = check_prefix(prefix)
        self.tracking_name = tracking_name
        self.sql = {k: self._render(v) for k, v in _STATEMENTS.items()}
        self.ddl = [
            self._render(s) + (self.table_options if s.startswith("CREATE TABLE") else "")
            for s in _DDL
        ]

    def _render(self, statement: str) -> str:
        return statement.replace("{p}", self.prefix)

    # -- driver-specific ---------------------------------------------------------------

    @abstractmethod
    def write(self) -> AbstractContextManager[Any]:
        """A write transaction, serialised against every other writer of this prefix.
        Yields a cursor-like object with ``execute`` / ``executemany`` / ``fetchall``."""

    @abstractmethod
    def read(self) -> AbstractContextManager[Any]:
        """A read transaction (one snapshot for the statements inside it)."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def table_exists(self, cur: Any, table: str) -> bool:
        """Whether the table ``{prefix}_{table}`` exists (inside ``cur``'s transaction)."""

    def _q(self, sql: str) -> str:
        return sql

    # -- shared --------------------------------------------------------------------------

    def create(self, cur: Any) -> None:
        for statement in self.ddl:
            cur.execute(self._q(statement))

    def create_indexes(self, cur: Any) -> None:
        for statement in self.ddl:
            if statement.startswith("CREATE UNIQUE INDEX"):
                cur.execute(self._q(statement))

    def tracked(self, cur: Any) -> int:
        cur.execute(
            self._q(
                f"SELECT notification_id FROM {self.tracking_table} WHERE application_name = ?"
            ),
            (self.tracking_name,),
        )
        row = cur.fetchone()
        return 0 if row is None else int(row[0])

    def set_tracked(self, cur: Any, position: int) -> bool:
        """Record ``position``; False if it is not past the one recorded (exactly once)."""
        t = self.tracking_table
        cur.execute(
            self._q(
                f"INSERT INTO {t} (application_name, notification_id) VALUES (?, ?) "
                "ON CONFLICT (application_name) DO UPDATE SET notification_id = "
                f"excluded.notification_id WHERE {t}.notification_id < excluded.notification_id"
            ),
            (self.tracking_name, position),
        )
        return bool(cur.rowcount == 1)

    def reset(self, cur: Any) -> None:
        """Empty every table for a rebuild. Where readers are not blocked by it
        (``rebuild_drops_indexes``), also drop the one-current-row indexes until
        :meth:`create_indexes`: bulk inserts are cheaper without them, and building them
        afterwards still checks every row."""
        for statement in self.ddl if self.rebuild_drops_indexes else ():
            if statement.startswith("CREATE UNIQUE INDEX"):
                name = statement.split()[6]  # CREATE UNIQUE INDEX IF NOT EXISTS <name>
                cur.execute(self._q(f"DROP INDEX IF EXISTS {name}"))
        for table in _TABLES:
            cur.execute(self._q(f"DELETE FROM {self.prefix}_{table}"))
        cur.execute(
            self._q(f"DELETE FROM {self.tracking_table} WHERE application_name = ?"),
            (self.tracking_name,),
        )

    def current(self, cur: Any) -> tuple[list[Any], ...]:
        """The current rows of ledgers, cells, slots, workers, the queue, the claims and
        the samples (the order :meth:`Fold.load` takes them in)."""
        out = []
        for key in (
            "current_ledgers",
            "current_cells",
            "current_slots",
            "current_workers",
            "current_queue",
            "current_claims",
            "current_samples",
        ):
            cur.execute(self._q(self.sql[key]))
            out.append(cur.fetchall())
        return tuple(out)

    def apply(self, cur: Any, changes: Changes) -> None:
        """Write ``changes``: closes first (a current row must be closed before its
        successor is inserted), then inserts."""
        sql = self.sql
        for key, rows in (
            ("ledger_close", changes.ledger_closes),
            ("cell_close", changes.cell_closes),
            ("slot_close", changes.slot_closes),
            ("worker_close", changes.worker_closes),
            ("queue_close", changes.queue_closes),
            ("claim_close", changes.claim_closes),
            ("sample_close", changes.sample_closes),
            ("ledger_insert", changes.ledger_inserts),
            ("cell_insert", changes.cell_inserts),
            ("slot_insert", changes.slot_inserts),
            ("node_insert", changes.node_inserts),
            ("worker_insert", changes.worker_inserts),
            ("queue_insert", changes.queue_inserts),
            ("claim_insert", changes.claim_inserts),
            ("sample_insert", changes.sample_inserts),
            ("count", list(changes.counts.items())),
        ):
            if rows:
                cur.executemany(self._q(sql[key]), rows)

    def select(
        self, cur: Any, key: str, params: Sequence[Any], where: str = ""
    ) -> Iterator[Sequence[Any]]:
        sql = self.sql[key] + (f" AND {where}" if where else "")
        cur.execute(self._q(sql), tuple(params))
        return iter(cur.fetchall())

    @staticmethod
    def subtree(lineage: str | None) -> tuple[str, tuple[str, ...]]:
        if lineage is None:
            return "", ()
        return _SUBTREE, subtree_params(lineage)
