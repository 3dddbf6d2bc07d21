# SQL text is built only from module constants, never from input.
# ruff: noqa: S608
"""The Merkle tree's tables, in the journal's own database.

No driver is imported here: on SQLite the transaction is the journal reader's
(:meth:`~charter.ledger.JournalReader.side_tables`: a connection of its own on the
journal's file, no eventsourcing), on PostgreSQL the journal application's own
eventsourcing datastore's (the connection pool its recorder uses). A write takes the
SQLite write lock first (``BEGIN IMMEDIATE``) or, on PostgreSQL, a transaction-scoped
advisory lock that serialises the tree's writers; the tree's rows and its tracking
position commit in that one transaction.

Tables: ``charter_merkle_leaves`` (leaf index → journal position), ``charter_merkle_nodes``
(every perfect subtree: level, index, hash; level 0 are the leaf hashes),
``charter_journal_keys`` (the journal key's verified rotations, by leaf) and
``charter_checkpoints`` (the signed notes published, by tree size).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from charter.audit.merkle import NodeKey
from charter.core.errors import InternalError, UnavailableError
from charter.ledger import JournalReader

__all__ = ["TRACKING_NAME", "TreeStore"]

TRACKING_NAME = "charter.audit.merkle"

_DDL = (
    "CREATE TABLE IF NOT EXISTS charter_merkle_leaves (leaf BIGINT PRIMARY KEY, "
    "position BIGINT NOT NULL UNIQUE)",
    "CREATE TABLE IF NOT EXISTS charter_merkle_nodes (level INTEGER NOT NULL, "
    "idx BIGINT NOT NULL, hash {blob} NOT NULL, PRIMARY KEY (level, idx))",
    "CREATE TABLE IF NOT EXISTS charter_journal_keys (after_leaf BIGINT PRIMARY KEY, "
    "key TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS charter_checkpoints (size BIGINT PRIMARY KEY, "
    "note TEXT NOT NULL, made_at_ms BIGINT NOT NULL)",
)


class TreeStore:
    """The tree's rows for one open journal (SQLite or PostgreSQL)."""

    def __init__(self, journal: JournalReader) -> None:
        self.kind = journal.location.kind
        self._journal = journal
        if self.kind != "sqlite":
            self._datastore: Any = journal.application.recorder.datastore
        self._mark = "?" if self.kind == "sqlite" else "%s"
        self.tracking_table = "tracking" if self.kind == "sqlite" else "charter_tracking"
        blob = "BLOB" if self.kind == "sqlite" else "BYTEA"
        with self.write() as cur:
            for statement in _DDL:
                cur.execute(statement.format(blob=blob))

    def _q(self, sql: str) -> str:
        return sql.replace("?", self._mark)

    @contextmanager
    def write(self) -> Iterator[Any]:
        """One write transaction, serialised against every other writer of the tree."""
        try:
            if self.kind == "sqlite":
                with self._journal.side_tables(write=True) as cur:
                    yield cur
            else:
                with self._datastore.transaction(commit=True) as cur:
                    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (TRACKING_NAME,))
                    yield cur
        except (InternalError, UnavailableError):
            raise
        except Exception as e:  # the driver's errors, translated once, here
            if type(e).__module__.startswith(("sqlite3", "psycopg", "eventsourcing")):
                raise UnavailableError(f"the Merkle tree's tables could not be written: {e}") from e
            raise

    @contextmanager
    def read(self) -> Iterator[Any]:
        """One read snapshot."""
        try:
            if self.kind == "sqlite":
                with self._journal.side_tables(write=False) as cur:
                    yield cur
                return
            with self._datastore.transaction(commit=False) as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                yield cur
        except Exception as e:
            if type(e).__module__.startswith(("sqlite3", "psycopg", "eventsourcing")):
                raise UnavailableError(f"the Merkle tree's tables could not be read: {e}") from e
            raise

    # -- reads ---------------------------------------------------------------------------

    def tracked(self, cur: Any) -> int:
        cur.execute(
            self._q(
                f"SELECT notification_id AS n FROM {self.tracking_table} WHERE application_name = ?"
            ),
            (TRACKING_NAME,),
        )
        row = cur.fetchone()
        return 0 if row is None else int(row["n"])

    def size(self, cur: Any) -> int:
        cur.execute("SELECT COALESCE(MAX(leaf) + 1, 0) AS n FROM charter_merkle_leaves")
        return int(cur.fetchone()["n"])

    def nodes(self, cur: Any, keys: Iterable[NodeKey]) -> dict[NodeKey, bytes]:
        wanted = sorted(set(keys))
        found: dict[NodeKey, bytes] = {}
        for i in range(0, len(wanted), 200):
            chunk = wanted[i : i + 200]
            where = " OR ".join("(level = ? AND idx = ?)" for _ in chunk)
            cur.execute(
                self._q(f"SELECT level, idx, hash FROM charter_merkle_nodes WHERE {where}"),
                tuple(v for key in chunk for v in key),
            )
            for row in cur.fetchall():
                found[(int(row["level"]), int(row["idx"]))] = bytes(row["hash"])
        return found

    def all_nodes(self, cur: Any) -> dict[NodeKey, bytes]:
        """Every stored node (for proofs of most of the tree at once)."""
        cur.execute("SELECT level, idx, hash FROM charter_merkle_nodes")
        return {(int(r["level"]), int(r["idx"])): bytes(r["hash"]) for r in cur.fetchall()}

    def leaf_of(self, cur: Any, position: int) -> int | None:
        cur.execute(
            self._q("SELECT leaf FROM charter_merkle_leaves WHERE position = ?"), (position,)
        )
        row = cur.fetchone()
        return None if row is None else int(row["leaf"])

    def leaves_of(self, cur: Any, positions: Iterable[int]) -> dict[int, int]:
        """position → leaf index, for the positions that are leaves."""
        wanted = sorted(set(positions))
        if not wanted:
            return {}
        cur.execute(
            self._q(
                "SELECT leaf, position FROM charter_merkle_leaves "
                "WHERE position >= ? AND position <= ?"
            ),
            (wanted[0], wanted[-1]),
        )
        want = set(wanted)
        return {int(r["position"]): int(r["leaf"]) for r in cur.fetchall() if r["position"] in want}

    def position_of(self, cur: Any, leaf: int) -> int | None:
        cur.execute(self._q("SELECT position FROM charter_merkle_leaves WHERE leaf = ?"), (leaf,))
        row = cur.fetchone()
        return None if row is None else int(row["position"])

    def last_position_before(self, cur: Any, size: int) -> int:
        """The journal position of the last leaf of a tree of ``size`` leaves (0 if none)."""
        return 0 if size == 0 else int(self.position_of(cur, size - 1) or 0)

    def checkpoints(self, cur: Any, limit: int = 1) -> list[tuple[int, str, int]]:
        cur.execute(
            self._q(
                "SELECT size, note, made_at_ms FROM charter_checkpoints ORDER BY size DESC LIMIT ?"
            ),
            (limit,),
        )
        return [(int(r["size"]), str(r["note"]), int(r["made_at_ms"])) for r in cur.fetchall()]

    # -- writes --------------------------------------------------------------------------

    def add(
        self,
        cur: Any,
        leaves: Sequence[tuple[int, int]],
        nodes: Sequence[tuple[int, int, bytes]],
        position: int,
    ) -> None:
        """Insert leaves (index, position) and nodes, and move the tracking position."""
        cur.executemany(
            self._q("INSERT INTO charter_merkle_leaves (leaf, position) VALUES (?, ?)"), leaves
        )
        cur.executemany(
            self._q("INSERT INTO charter_merkle_nodes (level, idx, hash) VALUES (?, ?, ?)"), nodes
        )
        t = self.tracking_table
        cur.execute(
            self._q(
                f"INSERT INTO {t} (application_name, notification_id) VALUES (?, ?) "
                "ON CONFLICT (application_name) DO UPDATE SET "
                "notification_id = excluded.notification_id"
            ),
            (TRACKING_NAME, position),
        )

    def rotations(self, cur: Any) -> list[tuple[int, bytes]]:
        """The journal key's verified rotations: (leaf of the rotation, new key)."""
        cur.execute("SELECT after_leaf, key FROM charter_journal_keys ORDER BY after_leaf")
        return [(int(r["after_leaf"]), bytes.fromhex(r["key"])) for r in cur.fetchall()]

    def add_rotation(self, cur: Any, leaf: int, key: bytes) -> None:
        cur.execute(
            self._q("INSERT INTO charter_journal_keys (after_leaf, key) VALUES (?, ?)"),
            (leaf, key.hex()),
        )

    def publish(self, cur: Any, size: int, note: str, at_ms: int) -> None:
        cur.execute(
            self._q(
                "INSERT INTO charter_checkpoints (size, note, made_at_ms) VALUES (?, ?, ?) "
                "ON CONFLICT (size) DO NOTHING"
            ),
            (size, note, at_ms),
        )
