"""Writing export bundles from a journal (the offline side is :mod:`charter.audit.bundle`).

The selection is a position range and/or a lineage (the entries whose payload names it
or a lineage below it). Context entries are added so the bundle verifies on its own:
the minted grants of every lineage the selection names and of all their ancestors, the
registrations of their roots (trust roots), and the journal key's rotations. Every entry
carries its inclusion proof in the tree of the bundle's checkpoint; nothing else of the
journal is revealed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from charter.audit.bundle import Bundle, BundleEntry
from charter.audit.errors import NotInTreeError
from charter.audit.keys import ROTATION_TOPIC
from charter.audit.note import Checkpoint, SignedNote, verify_checkpoint
from charter.audit.siem import flat_record
from charter.audit.tree import InclusionProof, MerkleLog, Signers
from charter.core.errors import BadInputError, StateError
from charter.ledger import Journal

__all__ = ["export_bundle", "export_jsonl", "lineages_in", "mentions"]

_CONTEXT_TYPES = ("GrantMinted/", "AgentRegistered/")


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def mentions(payload: dict[str, Any], lineage: str) -> bool:
    """Whether a payload names ``lineage`` or a lineage below it."""
    below = lineage + "/"
    return any(s == lineage or s.startswith(below) for s in _strings(payload))


def lineages_in(payload: dict[str, Any]) -> set[str]:
    """The lineage paths (``agent:…``) a payload names."""
    return {s for s in _strings(payload) if s.startswith("agent:") and " " not in s}


def _ancestors(lineage: str) -> Iterable[str]:
    node = lineage
    while True:
        yield node
        if "/" not in node:
            return
        node = node.rpartition("/")[0]


def export_bundle(
    journal: Journal,
    key: Signers | None,
    *,
    lineage: str | None = None,
    start: int | None = None,
    stop: int | None = None,
    checkpoint: SignedNote | None = None,
) -> Bundle:
    """A bundle of the selected entries, proved against ``checkpoint`` (a saved, perhaps
    cosigned, checkpoint of the journal) or a new one signed with ``key``, and sealed
    with ``key`` (the journal key that signs the checkpoint's size)."""
    if start is not None and stop is not None and start > stop:
        raise BadInputError(f"--from {start} is after --to {stop}")
    if key is None:
        raise BadInputError("a bundle is sealed with the journal's key: give it")
    log = MerkleLog(journal)
    note, cp = _checkpoint(log, key, checkpoint)
    selected: list[Any] = []
    context: dict[str, list[Any]] = {}
    rotations: list[Any] = []  # the key history's entries: every bundle carries them
    for batch in journal.batches(None, log.position_of_leaf(cp.size - 1) if cp.size else 0):
        for row in batch:
            position, _, _, topic, state = row[:5]
            payload = json.loads(state)["payload"]
            if topic.startswith(_CONTEXT_TYPES):
                context.setdefault(str(payload["lineage"]), []).append(row)
            elif topic.startswith(ROTATION_TOPIC):
                rotations.append(row)
            in_range = (start is None or position >= start) and (stop is None or position <= stop)
            if in_range and (lineage is None or mentions(payload, lineage)):
                selected.append((row, payload))
    if not selected:
        raise NotInTreeError("the selection has no entries in the checkpoint's tree")
    rows = {row[0]: (row, False) for row, _ in selected}
    if lineage is not None or start is not None or stop is not None:
        # A part of the journal: add the grant chains of every lineage it names (a
        # whole journal's selection holds them already).
        named = {a for _, payload in selected for n in lineages_in(payload) for a in _ancestors(n)}
        for name in named:
            for row in context.get(name, ()):
                rows.setdefault(row[0], (row, True))
    for row in rotations:
        rows.setdefault(row[0], (row, True))
    ordered = sorted(rows.items())
    proofs = log.inclusions([p for p, _ in ordered], cp.size)
    entries = tuple(
        _entry(journal, row, proof, is_context)
        for (_, (row, is_context)), proof in zip(ordered, proofs, strict=True)
    )
    selection = {"lineage": lineage, "from": start, "to": stop}
    keys = tuple(log.history().up_to(cp.size).to_json())
    bundle = Bundle(selection=selection, keys=keys, checkpoint=note.render(), entries=entries)
    return bundle.sealed(log.signer_for(key, cp.size))


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


def _entry(journal: Journal, row: Any, proof: InclusionProof, context: bool) -> BundleEntry:
    position, oid, version, topic, state, prev, chain = row
    return BundleEntry(
        position=position,
        originator=journal.originator_bytes(oid),
        version=version,
        topic=topic,
        state=bytes(state),
        prev_hash=bytes(prev),
        chain_hash=bytes(chain),
        leaf=proof.leaf,
        path=proof.path,
        context=context,
    )


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
            if lineage is not None and not mentions(json.loads(row[4])["payload"], lineage):
                continue
            yield flat_record(row, conv(row[1]))
