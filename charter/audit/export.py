"""Writing export bundles from a journal (the offline side is :mod:`charter.audit.bundle`).

The selection is a position range and/or a lineage (the entries whose payload names it
or a lineage below it). Context entries are added so the bundle verifies on its own:
the minted grants of every lineage the selection names and of all their ancestors, the
registrations of their roots (trust roots), and the journal key's rotations. The bundle
is written as a stream, in leaf order, one journal batch at a time: each entry's line,
or, for a run of entries it omits, the run's perfect subtree hashes (recomputed from
the entries' bytes as they are read). Nothing else of the journal is revealed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

import orjson

from charter.audit.bundle import (
    BundleWriter,
    LeafStream,
    Progress,
    entry_line,
    entry_lines,
    lineages_in,
    mentions,
)
from charter.audit.errors import NotInTreeError, TreeFollowError
from charter.audit.keys import ROTATION_TOPIC
from charter.audit.note import Checkpoint, SignedNote, verify_checkpoint
from charter.audit.siem import flat_record
from charter.audit.tree import MerkleLog, Signers
from charter.core.errors import BadInputError, StateError
from charter.core.framing import entry_frame
from charter.ledger import Journal

__all__ = ["ExportReport", "export_bundle", "export_jsonl", "lineages_in", "mentions"]

_CONTEXT_TYPES = ("GrantMinted/", "AgentRegistered/")


def _ancestors(lineage: str) -> Iterable[str]:
    node = lineage
    while True:
        yield node
        if "/" not in node:
            return
        node = node.rpartition("/")[0]


class ExportReport:
    """What an export wrote."""

    def __init__(self, entries: int, context: int, gaps: int, size: int, written: int) -> None:
        self.entries, self.context, self.gaps = entries, context, gaps
        self.checkpoint_size, self.bytes = size, written


def _context_positions(
    journal: Journal,
    last: int,
    selects: Callable[[int, Any], bool],
) -> set[int]:
    """The first pass of a partial export: the positions of the context entries (the
    grants and registrations of every lineage a selected entry names, and of their
    ancestors)."""
    named: set[str] = set()
    by_lineage: dict[str, list[int]] = {}
    for batch in journal.payloads(None, last):
        for position, topic, state in batch:
            payload = orjson.loads(state)["payload"]
            if topic.startswith(_CONTEXT_TYPES):
                by_lineage.setdefault(str(payload["lineage"]), []).append(position)
            if selects(position, payload):
                named.update(a for n in lineages_in(payload) for a in _ancestors(n))
    return {p for name in named for p in by_lineage.get(name, ())}


def export_bundle(
    journal: Journal,
    key: Signers | None,
    out: IO[bytes],
    *,
    lineage: str | None = None,
    start: int | None = None,
    stop: int | None = None,
    checkpoint: SignedNote | None = None,
    progress: Progress | None = None,
) -> ExportReport:
    """Write a bundle of the selected entries to ``out``, proved against ``checkpoint``
    (a saved, perhaps cosigned, checkpoint of the journal) or a new one signed with
    ``key``, and sealed with ``key`` (the journal key that signs the checkpoint's size).
    Memory: one batch of entries and O(log n) hashes (and, for a partial bundle, the
    positions of the grants it names)."""
    if start is not None and stop is not None and start > stop:
        raise BadInputError(f"--from {start} is after --to {stop}")
    if key is None:
        raise BadInputError("a bundle is sealed with the journal's key: give it")
    log = MerkleLog(journal)
    note, cp = _checkpoint(log, key, checkpoint)
    signer = log.signer_for(key, cp.size)
    last = log.position_of_leaf(cp.size - 1) if cp.size else 0
    whole = lineage is None and start is None and stop is None

    def selects(position: int, payload: Any) -> bool:
        in_range = (start is None or position >= start) and (stop is None or position <= stop)
        return in_range and (lineage is None or mentions(payload, lineage))

    context = set() if whole or not cp.size else _context_positions(journal, last or 0, selects)
    writer = BundleWriter(
        out,
        selection={"lineage": lineage, "from": start, "to": stop},
        keys=log.history().up_to(cp.size).to_json(),
        checkpoint=note.render(),
    )
    try:
        _write_leaves(journal, writer, cp, last, whole, context, selects, progress)
    finally:
        writer.close()
    writer.seal(signer)
    return ExportReport(writer.entries, writer.context, writer.gaps, cp.size, writer.bytes)


def _write_leaves(
    journal: Journal,
    writer: BundleWriter,
    cp: Checkpoint,
    last: int | None,
    whole: bool,
    context: set[int],
    selects: Callable[[int, Any], bool],
    progress: Progress | None,
) -> None:
    """Every leaf of the checkpoint's tree to ``writer``, each written or omitted; the
    tree they rebuild checked against the checkpoint."""
    stream = LeafStream(writer)
    conv = journal.originator_bytes
    for batch in journal.batches(None, last) if cp.size else ():
        if whole:  # every entry's line, in one loop per batch
            lines, leaves = entry_lines(batch, conv, stream.leaf)
            stream.write_block(lines, leaves)
            if progress is not None:
                progress(stream.leaf, cp.size)
            continue
        for position, oid, version, topic, stored, link, chained in batch:
            state = bytes(stored)
            originator = conv(oid)
            prev = bytes(link)
            frame = entry_frame(prev, position, originator, version, topic.encode(), state)
            is_context = not selects(position, orjson.loads(state)["payload"])
            if is_context and position not in context and not topic.startswith(ROTATION_TOPIC):
                stream.omit(frame)
                continue
            line = entry_line(
                position=position,
                originator=originator,
                version=version,
                topic=topic,
                state=state,
                prev_hash=prev,
                chain_hash=bytes(chained),
                leaf=stream.leaf,
                context=is_context,
            )
            stream.write(frame, line, context=is_context)
        if progress is not None:
            progress(stream.leaf, cp.size)
    if stream.leaf != cp.size or stream.root() != cp.root:
        raise TreeFollowError(
            f"the journal's first {stream.leaf} entries do not rebuild the checkpoint's "
            f"tree of {cp.size} (run `charter journal verify`)"
        )
    if not writer.entries:
        raise NotInTreeError("the selection has no entries in the checkpoint's tree")


def _checkpoint(
    log: MerkleLog, key: Signers | None, given: SignedNote | None
) -> tuple[SignedNote, Checkpoint]:
    """The checkpoint to prove against: ``given`` (checked to be of this journal's tree),
    else a new one signed with ``key``."""
    size = log.catch_up()
    if given is not None:
        cp = verify_checkpoint(given, log.note_key(Checkpoint.parse(given.text).size))
        if cp.size > size or log.root(cp.size)[1] != cp.root:
            raise StateError("the checkpoint given is not one of this journal's tree")
        return given, cp
    if key is None:
        raise BadInputError("a bundle needs a checkpoint: give one, or the journal's key")
    note = log.checkpoint(key, catch_up=False)
    return note, Checkpoint.parse(note.text)


def export_jsonl(
    journal: Journal,
    *,
    lineage: str | None = None,
    start: int | None = None,
    stop: int | None = None,
) -> Iterator[dict[str, Any]]:
    """The selected entries as flat, decoded records (:mod:`charter.audit.siem`)."""
    if start is not None and stop is not None and start > stop:
        raise BadInputError(f"--from {start} is after --to {stop}")
    conv = journal.originator_bytes
    for batch in journal.batches(start, stop):
        for row in batch:
            if lineage is not None and not mentions(orjson.loads(row[4])["payload"], lineage):
                continue
            yield flat_record(row, conv(row[1]))
