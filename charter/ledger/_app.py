"""The eventsourcing side of the journal: envelope events, the canonical mapper and the
application. Domain code never sees these; it appends :class:`~charter.core.events.Event`
payloads through :class:`~charter.ledger.journal.Journal`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from uuid import UUID, uuid4, uuid5

from eventsourcing.application import Application
from eventsourcing.persistence import Mapper, StoredEvent

from charter.core.events import Event, canonical_json, event_class
from charter.ledger.errors import UndecodableEntryError

__all__ = [
    "Envelope",
    "CanonicalMapper",
    "JournalApplication",
    "batch_marker",
    "decode_entry",
    "decode_state",
    "stream_uuid",
]

# Streams are named by strings ("agent:root", "sandbox:ab12"); their eventsourcing
# originator id is a name-based UUID so every process derives the same one.
_STREAM_NAMESPACE = UUID("5d1c6c2e-4b5e-4a55-9a43-2b8f6e1c0c11")


def stream_uuid(stream: str | None) -> UUID:
    return uuid4() if stream is None else _named_stream(stream)


@lru_cache(maxsize=65_536)
def _named_stream(stream: str) -> UUID:
    return uuid5(_STREAM_NAMESPACE, stream)


@dataclass(frozen=True)
class Envelope:
    """A domain event as eventsourcing sees it: identity, version, time, payload."""

    originator_id: UUID
    originator_version: int
    timestamp: datetime
    event: Event
    batch: str | None = None  # the append it was written by (see Journal.append)


def encode_state(envelope: Envelope) -> bytes:
    # Sorted keys: "at" stays first (the commit time is stamped in place), then the
    # batch id, then the payload. Entries written before batch ids simply lack the key.
    data: dict[str, Any] = {
        "at": envelope.timestamp.isoformat(timespec="microseconds"),
        "payload": envelope.event.payload(),
    }
    if envelope.batch is not None:
        data["batch"] = envelope.batch
    return canonical_json(data)


def batch_marker(batch: str) -> bytes:
    """The bytes a stored state holds when it was written by ``batch`` (a hex id)."""
    return b'"batch":"' + batch.encode() + b'"'


def decode_state(topic: str, state: bytes) -> tuple[datetime, Event]:
    """Stored bytes back to (recorded_at, event); the bytes themselves never change.

    Bytes that do not decode as the type they name (altered, or written by another
    version of that type) raise :class:`UndecodableEntryError`, never a driver's or
    pydantic's own error."""
    at, event, _ = decode_entry(topic, state)
    return at, event


def decode_entry(topic: str, state: bytes) -> tuple[datetime, Event, str | None]:
    """Like :func:`decode_state`, plus the id of the batch that wrote the entry (None
    for entries written before batches had ids)."""
    cls = event_class(topic)
    try:
        data: dict[str, Any] = json.loads(state)
        batch = data.get("batch")
        at, event = datetime.fromisoformat(data["at"]), cls.model_validate(data["payload"])
        return at, event, batch if isinstance(batch, str) else None
    except (ValueError, KeyError, TypeError) as e:  # ValidationError is a ValueError
        raise UndecodableEntryError(
            f"a journal entry of type {topic!r} does not decode as that type ({e}); "
            "run `charter journal verify` to see whether it was altered"
        ) from e


class CanonicalMapper(Mapper[UUID]):
    """Stores an envelope as ``Type/vN`` plus canonical JSON; no transcoder, no cipher.

    The stored bytes are exactly what the chain hashes, so they must be one canonical
    encoding with no optional layers that would differ between writers.
    """

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        envelope: Envelope = domain_event
        return StoredEvent(
            originator_id=envelope.originator_id,
            originator_version=envelope.originator_version,
            topic=type(envelope.event).topic(),
            state=encode_state(envelope),
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        at, event = decode_state(stored_event.topic, stored_event.state)
        oid = stored_event.originator_id
        return Envelope(
            originator_id=oid if isinstance(oid, UUID) else UUID(str(oid)),
            originator_version=stored_event.originator_version,
            timestamp=at,
            event=event,
        )


class JournalApplication(Application[UUID]):
    """The library's Application, configured for the chained journal."""

    name = "charter"
    log_section_size = 1000
    is_snapshotting_enabled = False

    def construct_mapper(self) -> Mapper[UUID]:
        return CanonicalMapper(transcoder=self.construct_transcoder())


def now() -> datetime:
    return datetime.now(UTC)
