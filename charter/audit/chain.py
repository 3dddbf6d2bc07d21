"""Offline verification of the journal's hash chain.

:func:`audit_chain` walks the chain (whole or a range), recomputes every hash from the
stored bytes and returns a frozen :class:`ChainReport` naming the first bad position and
why. :func:`verify_chain` does the same and raises :class:`ChainBrokenError` on failure.
A chain alone cannot show that its tail was cut off; pass a previously recorded head
(``expect_head``) to catch truncation or a rewritten history.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from charter.audit.errors import ChainBrokenError
from charter.core.errors import BadInputError
from charter.core.framing import GENESIS, ChainRow, entry_hash

__all__ = [
    "ChainSource",
    "ChainBrokenError",
    "ChainHead",
    "ChainReport",
    "Fault",
    "audit_chain",
    "parse_head",
    "verify_chain",
    "finish_report",
]


class Fault(StrEnum):
    """Why an entry does not verify."""

    CHANGED = "changed"  # stored bytes do not match the entry's hash
    MISSING = "missing"  # links to a predecessor that is not in the journal
    REORDERED = "reordered"  # links to an entry that is elsewhere in the journal
    BROKEN_LINK = "broken-link"  # links to something else entirely
    TRUNCATED = "truncated"  # ends before a previously recorded head
    DIVERGED = "diverged"  # the entry at a recorded head's position has another hash


class ChainHead(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    position: int
    hash: str  # hex

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


class ChainReport(BaseModel):
    """The outcome of a verification; also the ``--json`` document of ``journal verify``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    checked: int
    head: ChainHead | None
    first_bad_position: int | None = None
    fault: Fault | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "head": self.head.to_json() if self.head else None,
            "first_bad_position": self.first_bad_position,
            "fault": self.fault.value if self.fault else None,
            "reason": self.reason,
        }


class ChainSource(Protocol):
    """What verification needs from a journal (raw rows and two look-ups)."""

    def batches(self, start: int | None = None, stop: int | None = None) -> Any: ...
    def originator_bytes(self, stored: Any) -> bytes: ...
    def predecessor(self, position: int) -> ChainRow | None: ...
    def position_of_hash(self, chain_hash: bytes) -> int | None: ...


def parse_head(text: str) -> ChainHead:
    """``POS:HEXHASH`` as printed by ``charter journal verify``."""
    pos, _, digest = text.partition(":")
    if pos.isdigit() and len(digest) == 64 and all(c in "0123456789abcdefABCDEF" for c in digest):
        return ChainHead(position=int(pos), hash=digest.lower())
    raise BadInputError(
        f"expected head {text!r} is not POS:HASH (a position and 64 hex digits, as "
        "printed by `charter journal verify`)"
    )


_CHANGED = "its stored bytes do not match its hash (the entry was changed)"


def _link_fault(source: ChainSource, link: bytes, last_position: int) -> tuple[Fault, str]:
    """Why an entry's link is not the hash of the entry before it (reads only the link:
    the entry's other columns may not even decode)."""
    target = source.position_of_hash(link)
    if target is None:
        return Fault.MISSING, (
            "its predecessor is not in the journal: an entry before it was deleted, or its "
            "link was altered"
        )
    if target != last_position:
        return Fault.REORDERED, (
            f"it links to the entry at position {target}, not to the entry before it "
            f"(position {last_position}): entries were reordered"
        )
    return Fault.BROKEN_LINK, "its link does not match the hash of the entry before it"


def audit_chain(
    source: ChainSource,
    *,
    start: int | None = None,
    stop: int | None = None,
    expect_head: ChainHead | None = None,
    progress: Callable[[int], None] | None = None,
) -> ChainReport:
    """Walk the chain and report; never raises for a bad chain."""
    before = source.predecessor(start) if start else None
    prev = before.chain_hash if before else GENESIS
    last_position = before.position if before else 0
    checked = 0

    def bad(position: int, fault: Fault, why: str) -> ChainReport:
        head = ChainHead(position=last_position, hash=prev.hex()) if checked else None
        return ChainReport(
            ok=False,
            checked=checked,
            head=head,
            first_bad_position=position,
            fault=fault,
            reason=why,
        )

    # The hot loop (a million entries in a few seconds): locals and a topic cache keep
    # the per-entry cost to one framing and one sha256, both in charter.core.framing.entry_hash.
    conv = source.originator_bytes
    topics: dict[str, bytes] = {}
    for batch in source.batches(start, stop):
        for position, oid, version, topic, state, link, stored_hash in batch:
            if link != prev:
                return bad(position, *_link_fault(source, link, last_position))
            # A column that no longer decodes (SQLite keeps whatever type is written: a
            # blob topic, a REAL version) is a changed entry, never an internal error, and
            # never compared: no stored value may stand in for a hash it has not got.
            try:
                topic_bytes = topics.get(topic)
                if topic_bytes is None:
                    topic_bytes = topics[topic] = topic.encode()
                recomputed = entry_hash(prev, position, conv(oid), version, topic_bytes, state)
            except (ValueError, TypeError, OverflowError, AttributeError, struct.error):
                return bad(position, Fault.CHANGED, _CHANGED)
            if recomputed != stored_hash:
                return bad(position, Fault.CHANGED, _CHANGED)
            prev = stored_hash
            last_position = position
            checked += 1
        if progress is not None:
            progress(checked)

    head = ChainHead(position=last_position, hash=prev.hex()) if last_position else None
    return finish_report(source, checked, head, expect_head)


def finish_report(
    source: ChainSource, checked: int, head: ChainHead | None, expect: ChainHead | None
) -> ChainReport:
    """The report of a walk that found nothing wrong, checked against a recorded head."""
    fault = _head_fault(source, head.position if head else 0, expect) if expect else None
    if fault is None:
        return ChainReport(ok=True, checked=checked, head=head)
    first_bad, kind, why = fault
    return ChainReport(
        ok=False, checked=checked, head=head, first_bad_position=first_bad, fault=kind, reason=why
    )


def _head_fault(
    source: ChainSource, last_position: int, expect: ChainHead
) -> tuple[int, Fault, str] | None:
    """Compare the journal against a head recorded earlier (truncation, rewrite)."""
    found = next(
        (r for batch in source.batches(expect.position, expect.position) for r in batch), None
    )
    if found is None:
        first_bad = last_position + 1 if last_position < expect.position else expect.position
        return (
            first_bad,
            Fault.TRUNCATED,
            (
                f"a head at position {expect.position} was recorded, but the journal has no "
                f"entry there (it ends at {last_position}): the tail was cut off"
            ),
        )
    stored = bytes(found[6]).hex()  # the chain_hash column of the raw row
    if stored != expect.hash:
        return (
            expect.position,
            Fault.DIVERGED,
            (
                f"entry {expect.position} has hash {stored}, but the recorded "
                f"head says {expect.hash}: history was rewritten"
            ),
        )
    return None


def verify_chain(
    source: ChainSource,
    *,
    start: int | None = None,
    stop: int | None = None,
    expect_head: ChainHead | None = None,
) -> ChainReport:
    """Like :func:`audit_chain`, but raises :class:`ChainBrokenError` when it fails."""
    report = audit_chain(source, start=start, stop=stop, expect_head=expect_head)
    if not report.ok:
        raise ChainBrokenError(report)
    return report
