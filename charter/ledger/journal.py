"""The journal: a durable, hash-chained, append-only event log.

The rule it serves: nothing takes effect until the event that describes it is committed.
:meth:`Journal.append` writes a batch in one transaction and returns only after the
commit, with each entry's position and hash; callers act after it returns. A failed
append raises :class:`~charter.ledger.errors.AppendFailedError` and leaves nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from uuid import UUID, uuid4

from eventsourcing.persistence import IntegrityError, PersistenceError, ProcessRecorder, Tracking

from charter.core.errors import BadInputError, StateError, UnavailableError
from charter.core.events import Event
from charter.ledger._app import (
    Envelope,
    JournalApplication,
    batch_marker,
    decode_entry,
    encode_state,
    now,
    stream_uuid,
)
from charter.ledger._location import Location, resolve_location
from charter.ledger._reader import JournalReader
from charter.ledger._records import (
    Committed,
    Entry,
    JournalCreated,
    as_committed,
    outcome_unknown,
    rows_if_mine,
    settle,
)
from charter.ledger._rows import (
    ChainRow,
    CommitOutcomeAmbiguousError,
    CommitPastDeadlineError,
    HeadMovedError,
    JournalMeta,
    PinnedStreamMovedError,
    WriteLockTimeoutError,
    batch_id_of,
    last_commit,
    payload_bytes,
)
from charter.ledger._stores import Store, refuse_existing, store_for

if TYPE_CHECKING:
    from charter.ledger._listen import CommitListener
from charter.ledger.errors import (
    AlreadyTrackedError,
    AppendConflictError,
    AppendFailedError,
    BatchCommittedError,
    DeadlinePassedError,
    HeadPinLostError,
    UnknownSchemeError,
    WriterStalledError,
)

__all__ = [
    "AlreadyTrackedError",
    "AppendConflictError",
    "Committed",
    "Entry",
    "Journal",
    "JournalCreated",
    "Location",
    "UnknownSchemeError",
    "resolve_location",
]

_MAX_RETRIES = 8
# How long an append waits, after its connection broke mid-COMMIT, for the server to
# answer on a fresh connection and for the old session to end (PostgreSQL ends a
# session idle in a transaction after 5 s; see Location.app_env).
SETTLE_WAIT_S = 15.0


_STALE_DECISION = (
    "another writer appended to a stream this decision was based on; re-read the state "
    "and decide again"
)


def _conflict(error: PinnedStreamMovedError) -> AppendConflictError:
    if isinstance(error, HeadMovedError):
        return HeadPinLostError(
            f"{error}; nothing written: decide again on the journal as it is now"
        )
    return AppendConflictError(_STALE_DECISION)


def _checked(events: Iterable[Event]) -> tuple[Event, ...]:
    batch = tuple(events)
    if not batch:
        raise BadInputError("append needs at least one event")
    for event in batch:
        if not isinstance(event, Event) or not type(event).type_name:
            raise BadInputError(f"{event!r} is not a registered Charter event")
    return batch


class Journal(JournalReader):
    """An open journal. Use :meth:`create` once, then :meth:`open` everywhere else; its
    reads are :class:`~charter.ledger._reader.JournalReader`'s."""

    def __init__(
        self,
        location: Location,
        store: Store,
        meta: JournalMeta,
        env: Mapping[str, str] | None = None,
        *,
        read_only: bool = False,
    ) -> None:
        super().__init__(location, store, meta, read_only=read_only)
        self._app: JournalApplication | None = None
        self.settle_wait_s = SETTLE_WAIT_S
        self._batch_index = False  # known to have the batch index (see _ensure_batch_index)
        if read_only:  # no eventsourcing application: nothing opens the file to write
            return
        app_env = location.app_env()
        for key, value in (env or {}).items():
            app_env[key] = app_env[f"CHARTER_{key}"] = value
        try:
            self._app = JournalApplication(env=app_env)
        except PersistenceError as e:
            raise UnavailableError(f"cannot open journal {location.display}: {e}") from e
        recorder = self._app.recorder
        if not isinstance(recorder, ProcessRecorder):  # pinned by Location.app_env
            raise StateError(f"journal recorder {type(recorder).__name__} cannot track positions")
        self._recorder: ProcessRecorder = recorder

    def _writer(self) -> tuple[JournalApplication, ProcessRecorder]:
        """The application and recorder, for appends and tracked reads; refused on a
        closed journal (its connection pool is gone: the library's error is not ours)
        and on one opened read-only."""
        if self._closed:
            raise StateError(f"journal {self.location.display} was closed; open it again")
        if self._app is None:
            raise StateError(f"journal {self.location.display} was opened read-only")
        return self._app, self._recorder

    # -- lifecycle -----------------------------------------------------------------

    @classmethod
    def create(
        cls, url: str | Location | None = None, *, journal_key: str = "", resume: bool = False
    ) -> Journal:
        """Create the schema (events, append-only triggers, metadata) in one transaction.

        Refuses when a journal, or any other file, is already there: nothing is written.
        ``resume=True`` (an init finishing what it left unfinished) opens a journal made
        with the same ``journal_key`` instead, and creates the schema in an empty SQLite
        file; anything else there is still refused. Nothing is ever deleted that this
        call did not create.
        """
        location = resolve_location(url)
        store = store_for(location)
        if resume:
            try:
                existing = store.read_meta()
            except StateError:
                existing = None
            if existing is not None:
                if existing.journal_key != journal_key:
                    store.close()
                    raise StateError(
                        f"{location.display} holds a journal made with another key; it is "
                        "not the one this init left unfinished (refusing to touch it)"
                    )
                return cls(location, store, existing)
        else:
            refuse_existing(location, store)
        meta = JournalMeta(created_at=datetime.now(UTC).isoformat(), journal_key=journal_key)
        try:
            store.create_schema(meta, reuse_empty=resume)
        except BaseException:
            store.close()
            raise
        return cls(location, store, meta)

    @staticmethod
    def refuse_existing(url: str | Location | None = None) -> None:
        """Raise StateError if ``url`` already holds a journal (or any other file)."""
        location = resolve_location(url)
        store = store_for(location)
        try:
            refuse_existing(location, store)
        finally:
            store.close()

    @staticmethod
    def open_chain(url: str | Location | None = None) -> Store:
        """Only the raw rows of an existing journal (what verification reads), without
        the eventsourcing application: cheap enough to open once per worker process."""
        location = resolve_location(url)
        store = store_for(location)
        store.read_meta()
        return store

    @classmethod
    def open(
        cls,
        url: str | Location | None = None,
        *,
        env: Mapping[str, str] | None = None,
        read_only: bool = False,
    ) -> Journal:
        """Open an existing journal; never creates or changes anything.

        ``env`` adds eventsourcing settings (tests select fault-injecting subclasses of
        the chained recorders this way); the chained recorders refuse unsafe settings.
        ``read_only`` opens only the raw reader (verify, show): appending raises
        StateError, and a SQLite file nobody may write is read without side files.
        """
        location = resolve_location(url)
        store = store_for(location)
        meta = store.read_meta()
        return cls(location, store, meta, env, read_only=read_only)

    def close(self) -> None:
        self._closed = True
        if self._app is not None:
            self._app.close()
        super().close()

    def listen(self, on_commit: Callable[[], None]) -> CommitListener | None:
        """Call ``on_commit()`` after every commit any writer makes to this journal, and
        after each (re)connection of the listener (so a follower catches up from its
        own position): a PostgreSQL journal's ``LISTEN`` (one notification per
        committed transaction, a group commit's included, delivered after the commit;
        ``charter/ledger/_listen.py``). None on SQLite, which has no such channel: its
        followers poll. Close what it returns to stop listening."""
        if self.location.kind != "postgresql" or self.location.conninfo is None:
            return None
        # Loaded only here: a SQLite journal's process never loads the PostgreSQL driver.
        from charter.ledger._listen import CommitListener

        return CommitListener(self.location.conninfo, on_commit)

    @property
    def application(self) -> JournalApplication:
        """The underlying eventsourcing Application (notification log, followers)."""
        return self._writer()[0]

    # -- writing -------------------------------------------------------------------

    def tracked_position(self, follower: str) -> int:
        """The last journal position ``follower`` recorded (0 if none)."""
        _, recorder = self._writer()
        try:
            return int(recorder.max_tracking_id(follower) or 0)
        except PersistenceError as e:
            raise self._read_failed(e) from e

    def _read_failed(self, error: PersistenceError) -> UnavailableError:
        """A recorder read's driver error (already the library's PersistenceError,
        translated by the store's datastore) as the contract's UnavailableError."""
        return UnavailableError(
            f"journal {self.location.display} could not be read ({type(error).__name__}: "
            f"{error}); check the database and retry"
        )

    def stream_version(self, stream: str) -> int:
        """The version of ``stream`` now (0 when it has no events)."""
        return self._version(stream_uuid(stream))

    def stream_versions(self, streams: Iterable[str]) -> dict[str, int]:
        """The version of each of ``streams`` now (0 for one with no events), in one
        read: a decision reads its whole chain's, and on PostgreSQL each separate read
        is a round trip (docs/performance.md, helper pin)."""
        self._writer()  # refused when closed or read-only, like stream_version
        names = list(dict.fromkeys(streams))
        ids = {name: stream_uuid(name).bytes for name in names}
        found = self._store.stream_versions(list(ids.values()))  # UnavailableError if not
        return {name: found.get(oid, 0) for name, oid in ids.items()}

    def _version(self, originator: UUID) -> int:
        _, recorder = self._writer()
        try:
            last = recorder.select_events(originator, desc=True, limit=1)
        except PersistenceError as e:
            raise self._read_failed(e) from e
        return last[0].originator_version if last else 0

    def barrier_ms(self) -> int:
        """A time before which every entry stamped has committed (the write lock is
        taken and given back). A reader that refreshes after it has seen every entry
        stamped before it: what it decides as of then is settled (LeaseBook.remaining)."""
        _, recorder = self._writer()
        try:
            return int(recorder.barrier_ms())  # type: ignore[attr-defined]
        except PersistenceError as e:
            raise self._read_failed(e) from e

    def _envelopes(
        self, events: Sequence[Event], expect: Mapping[str, int], at: datetime, batch: str
    ) -> list[Envelope]:
        written = {e.stream() for e in events} - {None} - expect.keys()
        # The unpinned streams' versions now, in one read; the pinned ones as decided.
        versions: dict[str, int] = {**self.stream_versions(s for s in written if s), **expect}
        envelopes = []
        for event in events:
            stream = event.stream()
            if stream is None:
                envelopes.append(Envelope(stream_uuid(None), 1, at, event, batch))
                continue
            versions[stream] += 1
            envelopes.append(Envelope(stream_uuid(stream), versions[stream], at, event, batch))
        return envelopes

    def append(
        self,
        events: Iterable[Event],
        *,
        expect: Mapping[str, int] | None = None,
        tracking: tuple[str, int] | None = None,
        deadline_ms: int | None = None,
        batch: str | None = None,
        expect_head: int | None = None,
        not_before_ms: int | None = None,
    ) -> tuple[Committed, ...]:
        """Append ``events`` atomically; return their positions and hashes after commit.

        Every append has a batch id (``batch``, else a fresh one), stored in each of its
        entries, so it can be looked up (:meth:`batch_entries`, ``journal show
        --batch``). An id is unique under the write lock (the batch index's key, in
        the same transaction as the entries): an append whose id is already in the
        journal writes nothing and returns the entries committed under it if they hold
        these same events (a retry), else raises :class:`BatchCommittedError`; retrying
        with the same id never writes twice. If the connection breaks while the batch
        commits, the outcome is settled by re-reading on a fresh connection; if it
        cannot be settled in time,
        :class:`OutcomeUnknownError` names the batch (never AppendFailedError, which
        always means nothing was written).

        The commit time is stamped by the recorder under its write lock, so it never
        decreases with position. ``deadline_ms`` is the earliest deadline the decision
        relied on (a lease's end): a batch that would commit at or after it raises
        :class:`DeadlinePassedError` and nothing is written.

        ``expect`` pins stream versions the caller decided on, whether or not the batch
        writes to them; if another writer has appended to one of them since,
        :class:`AppendConflictError` is raised and nothing is written. Streams not
        pinned are versioned automatically (retrying a lost race).
        ``expect_head`` pins the whole journal: the batch commits only if, under the
        write lock, the journal's last position is still ``expect_head`` (nothing
        committed since the decision read up to it), and ``not_before_ms`` refuses a
        commit stamped before it; either refusal raises :class:`HeadPinLostError`
        (an :class:`AppendConflictError`) and nothing is written (a fan-out that took a
        recent expiry as final relies on both: docs/decisions-and-views.md).
        ``tracking=(follower, position)`` commits a follower's position in the same
        transaction (exactly once: a position already recorded raises
        :class:`AlreadyTrackedError`). Any other failure raises :class:`AppendFailedError`.
        """
        events_ = _checked(events)
        self._writer()  # refused when closed or read-only, before anything is done
        if batch is not None:
            _check_batch_id(batch)
        batch_id = batch or uuid4().hex
        self._ensure_batch_index()
        # A retry whose first try committed: answered from the index before any work.
        # Not the guarantee (another writer may commit this id after this read): that
        # is the index's primary key, checked under the write lock when this commits.
        earlier = self._earlier(batch_id, events_) if batch is not None else ()
        if earlier:
            return earlier
        pinned = dict(expect or {})
        # Pinned streams this batch does not write to: the recorder checks their
        # versions under its write lock (the stream keys catch the written ones).
        written = {event.stream() for event in events_}
        guards = tuple(
            (stream_uuid(stream), version)
            for stream, version in pinned.items()
            if stream not in written
        )
        for _ in range(_MAX_RETRIES):
            envelopes = self._envelopes(events_, pinned, now(), batch_id)
            try:
                # The application's event store: one recorder insert, one transaction
                # (what Application.save does, minus a per-event runtime Protocol
                # isinstance check that costs ~20 ms per 1000 events on Python 3.11).
                self._writer()[0].events.put(
                    envelopes,
                    tracking=Tracking(*tracking) if tracking else None,
                    guards=guards,
                    deadline_ms=deadline_ms,
                    expect_head=expect_head,
                    not_before_ms=not_before_ms,
                )
            except PinnedStreamMovedError as e:  # a pinned stream, or the pinned head
                raise _conflict(e) from e
            except CommitPastDeadlineError as e:
                raise DeadlinePassedError(str(e)) from e
            except WriteLockTimeoutError as e:
                raise WriterStalledError(
                    f"journal append failed, nothing written: {e}; retry once that writer is gone"
                ) from e
            except CommitOutcomeAmbiguousError as e:
                settled = settle(self._store, e, envelopes, self.settle_wait_s, self.location)
                if settled is None:
                    continue  # definitely not committed (its session has ended): retry
                return settled
            except IntegrityError as e:
                landed = self._resolve_integrity_error(e, envelopes, pinned, tracking)
                if landed is None:
                    continue  # lost a race on an unpinned stream: re-version and retry
                return landed
            except PersistenceError as e:
                raise AppendFailedError(
                    f"journal append failed, nothing written: {e}; check the journal at "
                    f"{self.location.display} and retry"
                ) from e
            commit = last_commit()
            if commit is None or len(commit.positions) != len(events_):
                raise AppendFailedError("journal recorder did not report the committed chain")
            at = datetime.fromisoformat(commit.stamp.decode())
            return tuple(
                Committed(p, h, env.event, at, batch_id)
                for p, h, env in zip(commit.positions, commit.hashes, envelopes, strict=True)
            )
        raise AppendConflictError(
            f"journal append lost {_MAX_RETRIES} races in a row for the same streams; retry"
        )

    def _ensure_batch_index(self) -> None:
        """Before the first append: a journal made before the batch index gets it, made
        from its entries' ids under the write lock (docs/decisions/0009). Without it
        the recorder's insert of the index row would fail; an append is never made
        without it (fail closed: two writers could then commit one id twice)."""
        if self._batch_index:
            return
        try:
            present = self._store.has_batch_index()
        except UnavailableError as e:
            raise AppendFailedError(f"journal append failed, nothing written: {e}") from e
        try:
            if not present:
                self._store.add_batch_index()
        except UnavailableError as e:
            raise AppendFailedError(
                f"journal append failed, nothing written: {self.location.display} has no "
                f"batch index and it could not be made ({e}); open it once as a user who "
                "may create tables there"
            ) from e
        self._batch_index = True

    def _indexed(self) -> bool:
        if not self._batch_index:
            self._batch_index = self._store.has_batch_index()
        return self._batch_index

    def _batch_rows(self, batch_id: str) -> list[ChainRow]:
        """The rows one append wrote: by the batch index (one key read, then the range
        of positions), or, in a journal made before the index and opened only to read,
        by a scan of the stored bytes. Fail closed if the index names positions that
        hold another batch's entries (the index is outside the chain)."""
        if not self._indexed():
            return self._scanned_batch(batch_id)
        span = self._store.batch_range(batch_id)
        if span is None:
            return []
        rows = list(self.rows(*span))
        if len(rows) != span[1] - span[0] + 1 or any(
            batch_id_of(row.state) != batch_id for row in rows
        ):
            raise StateError(
                f"the batch index names positions {span[0]}-{span[1]} for batch "
                f"{batch_id}, but the journal holds other entries there; run `charter "
                "journal verify`"
            )
        return rows

    def _scanned_batch(self, batch_id: str) -> list[ChainRow]:
        marker = batch_marker(batch_id)
        found: list[ChainRow] = []
        for rows in self._store.payloads():
            hits = {pos for pos, _topic, state in rows if marker in state}
            for pos in sorted(hits):
                found.extend(r for r in self.rows(pos, pos) if batch_id_of(r.state) == batch_id)
        return found

    def _earlier(self, batch_id: str, events: Sequence[Event]) -> tuple[Committed, ...]:
        """What an append with this id already committed (empty if none): its entries
        if they hold these very events (the same request, retried), else
        :class:`BatchCommittedError` (another request under this id: its entries are
        never handed to this one)."""
        rows = self._batch_rows(batch_id)
        if not rows:
            return ()
        if not _same_request(rows, events, batch_id):
            raise BatchCommittedError(
                f"batch {batch_id} already committed at positions {rows[0].position}-"
                f"{rows[-1].position} with other events; nothing written (a batch id "
                f"names one request; see `charter journal show --batch {batch_id}`)",
                batch=batch_id,
                positions=(rows[0].position, rows[-1].position),
            )
        return tuple(
            Committed(r.position, r.chain_hash, event, at, batch_id)
            for r, (at, event, _) in zip(
                rows, (decode_entry(r.topic, r.state) for r in rows), strict=True
            )
        )

    def require_new_batch(self, batch_id: str) -> None:
        """Raise :class:`BatchCommittedError` if an append with this id committed (a
        request retried after an outcome-unknown error that had in fact landed)."""
        _check_batch_id(batch_id)
        rows = self._batch_rows(batch_id)
        if rows:
            span = (rows[0].position, rows[-1].position)
            raise BatchCommittedError(
                f"batch {batch_id} already committed at positions {span[0]}-{span[1]}; "
                f"it is not done again (see `charter journal show --batch {batch_id}`)",
                batch=batch_id,
                positions=span,
            )

    def batch_entries(self, batch_id: str) -> list[Entry]:
        """The entries one append wrote, found by its batch id: one read of the batch
        index's key and one of their positions (a journal made before the index and
        opened read-only is scanned instead)."""
        return [_entry(row) for row in self._batch_rows(batch_id)]

    def record_refusal(self, event: Event, error: BaseException) -> None:
        """Journal a refusal; if the journal cannot take it, say so on ``error`` (which
        the caller raises either way: a refusal is never lost for want of a record)."""
        try:
            self.append([event])
        except AppendFailedError as e:
            error.add_note(f"(the refusal could not be journaled: {e})")

    def _resolve_integrity_error(
        self,
        error: IntegrityError,
        envelopes: Sequence[Envelope],
        pinned: Mapping[str, int],
        tracking: tuple[str, int] | None,
    ) -> tuple[Committed, ...] | None:
        """Decide what an integrity error meant, by re-reading (never by guessing).

        Returns the committed entries if this very batch did land (a retried commit
        whose acknowledgement was lost), None if the caller should retry, and raises
        for everything else.
        """
        try:
            return self._integrity_error_meant(error, envelopes, pinned, tracking)
        except AppendFailedError:
            raise  # settled: refused by the database, nothing written
        except UnavailableError as lost:  # the re-read itself failed: cannot be known
            raise outcome_unknown(self.location, envelopes[0].batch or "", lost) from lost

    def _integrity_error_meant(
        self,
        error: IntegrityError,
        envelopes: Sequence[Envelope],
        pinned: Mapping[str, int],
        tracking: tuple[str, int] | None,
    ) -> tuple[Committed, ...] | None:
        landed = self._landed(envelopes)
        if landed is not None:
            return as_committed(landed, envelopes)
        batch_id = envelopes[0].batch
        if batch_id:  # refused by the index's key: another append committed this id
            earlier = self._earlier(batch_id, [env.event for env in envelopes])
            if earlier:
                return earlier
        if tracking is not None and self.tracked_position(tracking[0]) >= tracking[1]:
            raise AlreadyTrackedError(
                f"{tracking[0]} has already recorded position {tracking[1]}"
            ) from error
        moved = self._moved(envelopes)
        if not moved:
            raise AppendFailedError(
                f"journal append refused by the database, nothing written: {error}"
            ) from error
        if moved & pinned.keys():
            raise AppendConflictError(_STALE_DECISION) from error
        return None  # only unpinned streams moved: re-version them and retry

    def _moved(self, envelopes: Sequence[Envelope]) -> set[str]:
        """The streams that moved past the version this batch was built on."""
        firsts: dict[str, tuple[UUID, int]] = {}
        for env in envelopes:
            stream = env.event.stream()
            if stream is not None:
                firsts.setdefault(stream, (env.originator_id, env.originator_version))
        return {stream for stream, (oid, first) in firsts.items() if self._version(oid) >= first}

    def _landed(self, envelopes: Sequence[Envelope]) -> list[ChainRow] | None:
        """After an integrity error, re-read: did this exact batch commit (lost ack)?"""
        rows = [self._store.find(e.originator_id.bytes, e.originator_version) for e in envelopes]
        return rows_if_mine(rows, envelopes)

    # -- reading -------------------------------------------------------------------

    def entries(
        self,
        start: int | None = None,
        stop: int | None = None,
        types: Sequence[str] = (),
    ) -> Iterator[Entry]:
        """Decoded entries in position order, optionally only of the given type names."""
        wanted = set(types)
        for row in self.rows(start, stop):
            if wanted and row.topic.partition("/v")[0] not in wanted:
                continue
            yield _entry(row)


def _entry(row: ChainRow) -> Entry:
    at, event, batch = decode_entry(row.topic, row.state)
    return Entry(
        position=row.position,
        topic=row.topic,
        event=event,
        recorded_at=at,
        stream=UUID(bytes=row.originator),
        stream_version=row.version,
        hash=row.chain_hash,
        prev_hash=row.prev_hash,
        batch=batch,
    )


def _check_batch_id(batch_id: str) -> None:
    if not (0 < len(batch_id) <= 64 and batch_id.isascii() and batch_id.isalnum()):
        raise BadInputError(f"batch id {batch_id!r} must be 1-64 ASCII letters or digits")


def _same_request(rows: Sequence[ChainRow], events: Sequence[Event], batch_id: str) -> bool:
    """Whether the committed rows hold exactly these events under this id, compared as
    stored bytes after the commit time (what a writer encodes; the recorder stamps the
    time). Stream versions are not compared: a retry may have been versioned anew."""
    if len(rows) != len(events):
        return False
    at = now()
    for row, event in zip(rows, events, strict=True):
        mine = encode_state(Envelope(stream_uuid(None), 1, at, event, batch_id))
        if row.topic != type(event).topic() or payload_bytes(row.state) != payload_bytes(mine):
            return False
    return True
