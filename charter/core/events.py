"""The event base: every journal entry's payload is a frozen, closed pydantic model.

Each event class has a stable ``type_name`` (never the Python path, so modules can move)
and a ``schema_version``. Its stored bytes are canonical JSON, produced by one encoder
(:func:`canonical_json`), and those stored bytes are what the chain hashes.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from charter.core.errors import BadInputError, UnknownEventTypeError

__all__ = ["Event", "UnknownEventTypeError", "canonical_json", "event_class", "event_types"]

_TYPE_NAME = re.compile(r"^[A-Z][A-Za-z0-9]{1,63}$")
_REGISTRY: dict[str, type[Event]] = {}


def _full_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def canonical_json(value: Any) -> bytes:
    """The one canonical encoder: sorted keys, no whitespace, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


class Event(BaseModel):
    """Base of every journal event.

    Subclasses set ``type_name`` (CamelCase, unique) and may set ``schema_version``.
    ``stream()`` names the stream the event belongs to (an aggregate in eventsourcing
    terms): events on one stream are versioned and conflict on concurrent appends,
    which is how a decision taken on stale state is caught. ``None`` means a standalone
    fact with a stream of its own.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type_name: ClassVar[str] = ""
    schema_version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("type_name", "")
        if not name:
            return  # an abstract intermediate class
        if not _TYPE_NAME.fullmatch(name):
            raise BadInputError(f"event type name {name!r} must be CamelCase letters/digits")
        if name in _REGISTRY and _full_name(_REGISTRY[name]) != _full_name(cls):
            raise BadInputError(f"event type name {name!r} is registered twice")
        _REGISTRY[name] = cls

    def stream(self) -> str | None:
        return None

    @classmethod
    def topic(cls) -> str:
        """The stored topic: ``type_name/vN``."""
        return f"{cls.type_name}/v{cls.schema_version}"

    def payload(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def event_class(topic: str) -> type[Event]:
    """Resolve a stored topic (``Name/vN``) to its event class."""
    name, _, version = topic.partition("/v")
    cls = _REGISTRY.get(name)
    if cls is None or str(cls.schema_version) != version:
        raise UnknownEventTypeError(
            f"journal entry has event type {topic!r}, which this Charter does not know; "
            "upgrade Charter to read it"
        )
    return cls


def event_types() -> dict[str, type[Event]]:
    return dict(_REGISTRY)
