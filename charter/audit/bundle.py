"""Export bundles, written and verified as a stream (pure: no journal, no database).

A bundle (``charter/bundle@v4``) is a file of lines, each ending in ``\\n``
(docs/VERIFYING.md §8):

1. the header: the canonical JSON (:func:`charter.core.events.canonical_json`,
   docs/VERIFYING.md §1) of ``{"checkpoint", "format", "keys", "kind": "header",
   "selection"}``;
2. one line per leaf run of the checkpoint's tree, in leaf order: an entry, the canonical
   JSON of ``{"chain_hash", "context", "kind": "entry", "leaf", "originator",
   "position", "prev_hash", "topic", "version"}`` with ``,"state":`` and the entry's
   stored state, its exact bytes, inserted before the closing ``}`` (a state holding a
   newline byte is given instead as a ``state_base64`` field, in its sorted place); or
   a gap ``{"end", "hashes", "kind": "gap", "start"}`` giving the perfect subtrees
   (:func:`charter.audit.merkle.decompose`) of leaves the bundle omits;
3. the trailer ``{"context", "entries", "gaps", "kind": "seal", "seal"}``: the journal
   key's signature over the SHA-256 of every byte before it.

The state is embedded raw so a verifier hashes the slice of the line it occupies and
parses the rest of the line once, where ``charter/bundle@v3`` (still verified) had it in
base64. Entries and gaps together cover the leaves ``0 … size−1`` of the checkpoint's
tree, so the verifier rebuilds its root in O(log n) memory (:class:`charter.audit.merkle.
CompactRange`) instead of reading a proof per entry; a bundle of the whole journal has
no gap. The seal covers the header (selection, keys, checkpoint), every entry and gap
and their order: removing, reordering or relabelling anything fails. :class:`BundleWriter`
writes one; :func:`verify_bundle` reads one line at a time and names the first part that
fails. Bundles of the earlier formats (one JSON document) are refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import multiprocessing
import os
import queue
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, Any, NamedTuple

import orjson
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey
from pydantic import BaseModel, ConfigDict, ValidationError

from charter.audit import merkle
from charter.audit.errors import BundleError
from charter.audit.keys import KeyHistory
from charter.audit.note import (
    Checkpoint,
    NoteKey,
    SignedNote,
    verify_checkpoint,
    verify_cosignature,
)
from charter.audit.semantic import Auditor, AuditReport, Finding
from charter.authority import SealedGrant, verify_grant_chain
from charter.core.errors import CharterError, UnavailableError
from charter.core.events import canonical_json
from charter.core.framing import LEAF_PREFIX, entry_frame, merkle_leaf_hash

__all__ = [
    "BUNDLE_FORMAT",
    "BundleEntry",
    "BundleReport",
    "BundleWriter",
    "LeafStream",
    "CONTEXT_TYPES",
    "MAX_LINE",
    "Progress",
    "entry_line",
    "entry_lines",
    "lineages_in",
    "mentions",
    "seal_signing_input",
    "verify_bundle",
]

BUNDLE_FORMAT = "charter/bundle@v4"
# v1 had no seal; v2 was one document, signed by parts; v3 is v4 with each entry's state
# in base64 (in its sorted place, "state"): still verified.
_V3 = "charter/bundle@v3"
_STATE = b',"state":'  # where a v4 entry line's state starts: its first occurrence
_STATE_SKIP = len(_STATE)
_loads = orjson.loads
_SEAL_CONTEXT = b"charter/bundle-seal/v2\x00"
MAX_LINE = 64 << 20  # a line longer than this is refused (bounded memory)
_MAX_HEADER = 1 << 20
# What a partial bundle adds, beside its selection, so its grant chains and key history
# verify (docs/VERIFYING.md §8).
CONTEXT_TYPES = ("GrantMinted", "AgentRegistered", "JournalKeyRotated")
_ROTATION = "JournalKeyRotated"
_SELECTION_KEYS = ("from", "lineage", "to")
_ENTRY_SIZE = 9  # an entry line's fields beside its state
Progress = Callable[[int, int], None]  # (leaves done, tree size)
_PROGRESS_EVERY = 20_000


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def mentions(payload: Any, lineage: str) -> bool:
    """Whether a payload names ``lineage`` or a lineage below it: a string value,
    at any depth, equal to ``lineage`` or starting with ``lineage + "/"``."""
    below = lineage + "/"
    return any(s == lineage or s.startswith(below) for s in _strings(payload))


def lineages_in(payload: Any) -> set[str]:
    """The lineage paths a payload names: its string values, at any depth, that start
    with ``agent:`` and hold no space."""
    return {s for s in _strings(payload) if s.startswith("agent:") and " " not in s}


def seal_signing_input(digest: bytes) -> bytes:
    """``"charter/bundle-seal/v2" ‖ 0x00 ‖ SHA-256(every byte before the trailer)``."""
    return _SEAL_CONTEXT + digest


# An entry line: the canonical JSON (sorted keys, no spaces) of its nine fields with its
# values filled in, then the state's bytes (the hex fields hold no character JSON escapes,
# the topic is encoded by orjson); or, for a state holding a newline byte, its canonical
# JSON with the state in base64 as a tenth field.
_LINE = (
    b'{"chain_hash":"%b","context":%b,"kind":"entry","leaf":%d,"originator":"%b",'
    b'"position":%d,"prev_hash":"%b","topic":%b,"version":%d,"state":%b}\n'
)
_LINE_BASE64 = (
    b'{"chain_hash":"%b","context":%b,"kind":"entry","leaf":%d,"originator":"%b",'
    b'"position":%d,"prev_hash":"%b","state_base64":"%b","topic":%b,"version":%d}\n'
)
_hexlify = binascii.hexlify
_b64 = binascii.b2a_base64


def entry_line(
    *,
    position: int,
    originator: bytes,
    version: int,
    topic: str,
    state: bytes,
    prev_hash: bytes,
    chain_hash: bytes,
    leaf: int,
    context: bool,
) -> bytes:
    """One entry's line: the canonical encoder's bytes for its nine fields (ASCII hex,
    integers, a boolean, the topic) filled into a template instead of encoded, and its
    state (tests/audit/test_bundle_stream.py checks the two agree)."""
    fields = (
        _hexlify(chain_hash),
        b"true" if context else b"false",
        leaf,
        _hexlify(originator),
        position,
        _hexlify(prev_hash),
    )
    if b"\n" in state:  # it would end the line: in base64
        return _base64_line(fields, state, orjson.dumps(topic), version)
    return _LINE % (*fields, orjson.dumps(topic), version, state)


def _base64_line(fields: tuple[Any, ...], state: bytes, topic: bytes, version: int) -> bytes:
    """The line of an entry whose state holds a newline byte (``fields``: its first
    six values, as :data:`_LINE` takes them; ``topic`` encoded)."""
    return _LINE_BASE64 % (*fields, _b64(state, newline=False), topic, version)


def entry_lines(
    rows: Iterable[Sequence[Any]], conv: Callable[[Any], bytes], leaf: int
) -> tuple[bytes, list[bytes]]:
    """The lines of consecutive journal rows (``Journal.batches``' raw tuples) as entries
    of a whole bundle from ``leaf`` on, and their leaves' hashes: :func:`entry_line` and
    :func:`charter.core.framing.merkle_leaf_hash` of each, in one loop (the exporter's
    hot path)."""
    lines: list[bytes] = []
    leaves: list[bytes] = []
    add_line, add_leaf = lines.append, leaves.append
    topics: dict[str, tuple[bytes, bytes]] = {}
    line, hexlify, sha256, frame_of = _LINE, _hexlify, hashlib.sha256, entry_frame
    for position, oid, version, topic, stored, link, chained in rows:
        encoded = topics.get(topic)
        if encoded is None:
            encoded = topics[topic] = (topic.encode(), orjson.dumps(topic))
        state, originator, prev = bytes(stored), conv(oid), bytes(link)
        frame = frame_of(prev, position, originator, version, encoded[0], state)
        add_leaf(sha256(LEAF_PREFIX + frame).digest())
        if b"\n" in state:
            first = (hexlify(chained), b"false", leaf, hexlify(originator), position, hexlify(prev))
            add_line(_base64_line(first, state, encoded[1], version))
        else:
            add_line(
                line
                % (
                    hexlify(chained),
                    b"false",
                    leaf,
                    hexlify(originator),
                    position,
                    hexlify(prev),
                    encoded[1],
                    version,
                    state,
                )
            )
        leaf += 1
    return b"".join(lines), leaves


class _Behind:
    """``work`` applied to blocks of bytes, in order, in a thread of its own: hashlib and
    file writes release the GIL on large blocks, so the seal's hashing and the writing run
    on another core than the loop making the blocks. Bounded: at most ``in_flight``
    blocks are put and not yet done (:meth:`put` waits). An error of ``work`` is raised
    by the next :meth:`put` or by :meth:`close`, which waits for every block put to be
    done."""

    def __init__(self, work: Callable[[bytes], object], in_flight: int = 2) -> None:
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._room = threading.Semaphore(in_flight)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[bytes], object]) -> None:
        while (block := self._queue.get()) is not None:
            if self._error is None:
                try:
                    work(block)
                except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                    self._error = e
            del block
            self._room.release()

    def put(self, block: bytes) -> None:
        if self._error is not None:
            self.close()
        self._room.acquire()
        self._queue.put(block)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


_WRITE_BLOCK = 1 << 20  # lines are handed to the writing thread in blocks of this


class BundleWriter:
    """Writes a bundle to ``out`` line by line, hashing what it writes for the seal (in
    a thread of its own, :class:`_Behind`: :meth:`seal` or :meth:`close` ends it)."""

    def __init__(
        self,
        out: IO[bytes],
        *,
        selection: Mapping[str, Any],
        keys: Sequence[Mapping[str, Any]],
        checkpoint: str,
    ) -> None:
        self._out = out
        self._hash = hashlib.sha256()
        self._behind = _Behind(self._hash_and_write)
        self._pending: list[bytes] = []  # lines not yet handed to the thread
        self._pending_bytes = 0
        self.entries = self.context = self.gaps = 0
        self.bytes = 0
        header = {
            "checkpoint": checkpoint,
            "format": BUNDLE_FORMAT,
            "keys": [dict(k) for k in keys],
            "kind": "header",
            "selection": {k: selection.get(k) for k in _SELECTION_KEYS},
        }
        self._write(canonical_json(header) + b"\n")

    def _hash_and_write(self, block: bytes) -> None:
        self._hash.update(block)
        self._out.write(block)

    def _write(self, line: bytes) -> None:
        self._pending.append(line)
        self._pending_bytes += len(line)
        self.bytes += len(line)
        if self._pending_bytes >= _WRITE_BLOCK:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._behind.put(b"".join(self._pending))
            self._pending.clear()
            self._pending_bytes = 0

    def close(self) -> None:
        """Wait until everything written so far is hashed and written (raising what
        writing it raised)."""
        self._flush()
        self._behind.close()

    def entry(self, line: bytes, *, context: bool) -> None:
        """An entry's line (:func:`entry_line`)."""
        self._write(line)
        if context:
            self.context += 1
        else:
            self.entries += 1

    def entries_block(self, lines: bytes, count: int) -> None:
        """``count`` selected entries' lines, joined (:func:`entry_lines`)."""
        self._write(lines)
        self.entries += count

    def gap(self, start: int, end: int, hashes: Sequence[bytes]) -> None:
        line = {"end": end, "hashes": [h.hex() for h in hashes], "kind": "gap", "start": start}
        self._write(canonical_json(line) + b"\n")
        self.gaps += 1

    def seal(self, key: SigningKey) -> None:
        """The trailer: ``key`` (the journal key that signs the checkpoint) signs the
        hash of every line written."""
        self.close()
        signature = key.sign(seal_signing_input(self._hash.digest())).signature
        trailer = {
            "context": self.context,
            "entries": self.entries,
            "gaps": self.gaps,
            "kind": "seal",
            "seal": base64.b64encode(signature).decode(),
        }
        line = canonical_json(trailer) + b"\n"
        self._out.write(line)
        self.bytes += len(line)


class LeafStream:
    """The leaves of a checkpoint's tree fed in order to a :class:`BundleWriter`: each
    either written (a selected or a context entry) or omitted (hashed into the run of
    omitted leaves it belongs to, written as a gap when the run ends). ``root()`` is the
    tree rebuilt from what was fed, which the exporter checks against its checkpoint."""

    def __init__(self, writer: BundleWriter) -> None:
        self.writer = writer
        self.tree = merkle.CompactRange()
        self.leaf = 0
        self._gap: merkle.GapHasher | None = None

    def omit(self, frame: bytes) -> None:
        if self._gap is None:
            self._gap = merkle.GapHasher(self.leaf)
        self._gap.push(merkle_leaf_hash(frame))
        self.leaf += 1

    def write(self, frame: bytes, line: bytes, *, context: bool) -> None:
        self._flush()
        self.tree.push(0, merkle_leaf_hash(frame))
        self.writer.entry(line, context=context)
        self.leaf += 1

    def write_block(self, lines: bytes, leaves: Sequence[bytes]) -> None:
        """Selected entries' lines, joined, and their leaves' hashes (:func:`entry_lines`)."""
        self._flush()
        self.tree.push_leaves(leaves)
        self.writer.entries_block(lines, len(leaves))
        self.leaf += len(leaves)

    def _flush(self) -> None:
        gap = self._gap
        if gap is None:
            return
        hashes = gap.hashes()
        for (level, _), digest in zip(merkle.decompose(gap.start, gap.end), hashes, strict=True):
            self.tree.push(level, digest)
        self.writer.gap(gap.start, gap.end, hashes)
        self._gap = None

    def root(self) -> bytes:
        self._flush()
        return self.tree.root()


class BundleEntry(NamedTuple):
    """One entry of a bundle, as read from its line (its stored bytes, decoded)."""

    position: int
    originator: bytes
    version: int
    topic: str
    state: bytes
    prev_hash: bytes
    chain_hash: str  # hex, as in the line: compared with the frame's hexdigest
    leaf: int
    context: bool

    def frame(self) -> bytes:
        return entry_frame(
            self.prev_hash,
            self.position,
            self.originator,
            self.version,
            self.topic.encode(),
            self.state,
        )

    def payload(self) -> Any:
        """The event's payload, read from the stored canonical JSON."""
        return orjson.loads(self.state)["payload"]

    @property
    def type_name(self) -> str:
        return self.topic.partition("/")[0]


class BundleReport(BaseModel):
    """What ``export verify`` found (its ``--json`` document on success)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    entries: int
    context: int
    gaps: int
    checkpoint_size: int
    cosignatures: int
    grant_chains: int
    audited: bool
    findings: tuple[Finding, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _hex(value: Any, size: int | None = None) -> bytes:
    """Lower-case hex of ``size`` bytes (any size if None), nothing else."""
    raw = bytes.fromhex(value)
    if (size is not None and len(raw) != size) or raw.hex() != value:
        raise ValueError(f"not {size or 'some'} bytes as lower-case hex")
    return raw


def _parse_line(line: bytes, where: str, *, canonical: bool = True) -> dict[str, Any]:
    """A line's object; with ``canonical``, refused unless the line is exactly its
    canonical encoding. Entry and gap lines skip that re-encoding (the hot path): every
    byte of them is sealed, so a line the exporter did not write fails at the seal
    whatever a parser reads in it."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise BundleError(where, f"the line is not JSON: {e}") from e
    if not isinstance(obj, dict):
        raise BundleError(where, "the line is not a JSON object")
    if canonical and canonical_json(obj) + b"\n" != line:
        raise BundleError(where, "the line is not the canonical JSON of its object")
    return obj


def _read_line(line: bytes, leaf: int, raw: bool) -> tuple[dict[str, Any], bytes | str | None]:
    """A line after the header as its object, and for an entry line its state: the bytes
    embedded in it (``raw``: a v4 bundle's), or the base64 text of its ``state_base64``
    field (v4) or ``state`` field (v3), taken out of the object; None if it has none.
    A v4 line holding ``,"state":`` is an entry whose state is every byte after the
    first one, up to its closing ``}`` and newline; the rest, with that ``}``, is the
    object of its other fields."""
    where = f"leaf/{leaf}"
    cut = line.find(_STATE) if raw else -1
    if cut >= 0:
        if not line.endswith(b"}\n"):
            raise BundleError(where, "an entry line does not end with its object's }")
        obj = _parse_line(line[:cut] + b"}\n", where, canonical=False)
        if obj.get("kind") != "entry":
            raise BundleError(where, "a line holding a state is not an entry")
        return obj, line[cut + _STATE_SKIP : -2]
    obj = _parse_line(line, where, canonical=False)
    if obj.get("kind") != "entry":
        return obj, None
    text = obj.pop("state_base64" if raw else "state", None)
    return obj, text if type(text) is str else None


def _entry(obj: dict[str, Any], state: bytes | str | None, expect_leaf: int) -> BundleEntry:
    """An entry line's object (its fields beside the state) and its state (its bytes, or
    base64 text) as an entry: exactly its nine fields, of their types; hex in lower case
    (the hashes are compared as text, :meth:`_Verifier.entry`)."""
    get = obj.get
    position, leaf, version = get("position"), get("leaf"), get("version")
    topic, context, originator = get("topic"), get("context"), get("originator")
    chain_hash, prev_hash = get("chain_hash"), get("prev_hash")
    if not (
        len(obj) == _ENTRY_SIZE
        and state is not None
        and type(position) is int
        and type(leaf) is int
        and type(version) is int
        and type(context) is bool
        and type(topic) is str
        and type(originator) is str
        and type(chain_hash) is str
        and type(prev_hash) is str
        and len(chain_hash) == 64
        and len(prev_hash) == 64
    ):
        raise BundleError(
            f"entry/{position}" if _int(position) else f"leaf/{expect_leaf}",
            "an entry line has exactly its fields and its state, of their types",
        )
    try:
        raw = bytes.fromhex(originator)
        entry = BundleEntry(
            position,
            raw,
            version,
            topic,
            # b64decode(validate=True)
            binascii.a2b_base64(state, strict_mode=True) if isinstance(state, str) else state,
            bytes.fromhex(prev_hash),
            chain_hash,
            leaf,
            context,
        )
    except (ValueError, binascii.Error) as e:
        raise BundleError(f"entry/{position}", f"the entry does not parse: {e}") from e
    if raw.hex() != originator:
        raise BundleError(f"entry/{position}", "its originator is not lower-case hex")
    if not (0 <= position < 2**64 and -(2**63) <= version < 2**63 and len(raw) < 2**16):
        raise BundleError(
            f"entry/{position}", "its position, version or originator is out of range"
        )
    return entry


class _Keys:
    """The key history the header claims, checked against the rotation entries as they
    arrive (their bytes are proven by the chain, the tree and the seal)."""

    def __init__(self, claimed: Any, anchor: NoteKey) -> None:
        if not isinstance(claimed, list) or not claimed or not isinstance(claimed[0], dict):
            raise BundleError("keys", "the header's keys are not a list of key objects")
        first = claimed[0]
        if first != {"after_leaf": -1, "key": anchor.text()}:
            raise BundleError(
                "keys",
                f"the bundle's key history does not start at the key given ({anchor.text()})",
            )
        self.claims: list[tuple[int, NoteKey]] = []
        last = -1
        for item in claimed[1:]:
            if not isinstance(item, dict) or set(item) != {"after_leaf", "key"}:
                raise BundleError("keys", "a key object is not {after_leaf, key}")
            leaf = item["after_leaf"]
            if not _int(leaf) or leaf <= last:
                raise BundleError("keys", "the rotations' leaves must increase")
            try:
                key = NoteKey.parse(str(item["key"]))
            except CharterError as e:
                raise BundleError("keys", f"the key after leaf {leaf} does not parse: {e}") from e
            self.claims.append((leaf, key))
            last = leaf
        self.history = KeyHistory.start(anchor.name, anchor.public_key)
        self.anchor = anchor
        self._next = 0  # the next claim a rotation entry must justify

    def claimed_for(self, size: int) -> NoteKey:
        """The key the header claims signed a checkpoint of ``size`` leaves."""
        key = self.anchor
        for leaf, claimed in self.claims:
            if leaf < size:
                key = claimed
        return key

    def rotation(self, entry: BundleEntry) -> None:
        if self._next >= len(self.claims) or self.claims[self._next][0] != entry.leaf:
            # not a valid rotation by the header's account: it must not be one
            try:
                self.history.rotated(entry.leaf, entry.payload())
            except (CharterError, ValueError, KeyError, TypeError):
                return
            raise BundleError("keys", f"the rotation at leaf {entry.leaf} is not in the keys")
        leaf, claimed = self.claims[self._next]
        try:
            self.history = self.history.rotated(leaf, entry.payload())
        except (CharterError, ValueError, KeyError, TypeError) as e:
            raise BundleError("keys", f"the rotation at leaf {leaf} does not verify: {e}") from e
        if self.history.note_key_for(leaf + 1).text() != claimed.text():
            raise BundleError("keys", f"the key after leaf {leaf} is not the one rotated to")
        self._next += 1

    def finish(self) -> None:
        if self._next < len(self.claims):
            leaf = self.claims[self._next][0]
            raise BundleError("keys", f"no rotation entry in the bundle at leaf {leaf}")


class _Grants:
    """Every grant chain of the bundle, checked as its entries arrive (an issuer's
    grant is minted before its children's, so it is always met first)."""

    def __init__(self) -> None:
        self.roots: dict[str, bytes] = {}
        self.chains: dict[str, tuple[SealedGrant, ...]] = {}
        self.checked = 0

    def add(self, entry: BundleEntry) -> None:
        where = f"entry/{entry.position}"
        try:
            payload = entry.payload()
            lineage = str(payload["lineage"])
            if entry.type_name == "AgentRegistered":
                self.roots.setdefault(lineage, bytes.fromhex(payload["trust_root"]))
                return
            sealed = SealedGrant.from_record(
                {"body": payload["body"], "signature": payload["signature"]}
            )
        except (ValueError, KeyError, TypeError, ValidationError, CharterError) as e:
            raise BundleError(where, f"its payload does not decode: {e}") from e
        issuer = str(sealed.grant.issuer)
        if issuer == lineage:
            chain: tuple[SealedGrant, ...] = (sealed,)
        else:
            above = self.chains.get(issuer)
            if above is None:
                raise BundleError(
                    f"grants/{lineage}",
                    f"the grant of {issuer} (an ancestor) is not in the bundle before it",
                )
            chain = (*above, sealed)
        root = str(chain[0].grant.lineage)
        trust_root = self.roots.get(root)
        if trust_root is None:
            raise BundleError(f"grants/{lineage}", f"the root {root}'s registration is missing")
        try:
            verify_grant_chain(chain, trust_root)
        except CharterError as e:
            raise BundleError(f"grants/{lineage}", str(e)) from e
        self.chains.setdefault(lineage, chain)
        self.checked += 1


def _header(stream: IO[bytes]) -> tuple[dict[str, Any], bytes]:
    """The header line, checked, and its bytes (its ``format`` says how entry lines
    hold their state: v4 raw, v3 in base64)."""
    line = stream.readline(_MAX_HEADER)
    if not line.endswith(b"\n"):
        legacy = line.startswith(b"{") and b'"format":"charter/bundle@v' in line
        raise BundleError(
            "format",
            f"not a {BUNDLE_FORMAT} bundle: its first line is not a header"
            + (
                " (an earlier bundle format, one JSON document: export it again with this Charter)"
                if legacy or not line
                else ""
            ),
        )
    header = _parse_line(line, "format")
    if header.get("format") not in (BUNDLE_FORMAT, _V3) or header.get("kind") != "header":
        raise BundleError("format", f"not a {BUNDLE_FORMAT} (or {_V3}) bundle header")
    if set(header) != {"checkpoint", "format", "keys", "kind", "selection"}:
        raise BundleError("format", "the header must have exactly its five fields")
    return header, line


def _selection(value: Any) -> tuple[str | None, int | None, int | None]:
    if not isinstance(value, dict) or set(value) != set(_SELECTION_KEYS):
        raise BundleError("selection", "the selection must be {from, lineage, to}")
    lineage, start, stop = value["lineage"], value["from"], value["to"]
    if lineage is not None and (not isinstance(lineage, str) or not lineage):
        raise BundleError("selection", "its lineage must be a non-empty string or null")
    for bound in (start, stop):
        if bound is not None and (not _int(bound) or bound < 1):
            raise BundleError("selection", "from and to must be positive integers or null")
    if start is not None and stop is not None and start > stop:
        raise BundleError("selection", "its from is after its to")
    return lineage, start, stop


def verify_bundle(
    source: IO[bytes] | bytes,
    journal_key: NoteKey,
    *,
    witness_keys: Sequence[NoteKey] = (),
    progress: Progress | None = None,
) -> BundleReport:
    """Verify a bundle offline, reading one line at a time; raise :class:`BundleError`
    naming the first part that does not verify.

    A bundle of the whole journal (a selection of nulls) holds every leaf and is also
    audited semantically (:mod:`charter.audit.semantic`), entry by entry; its findings
    make the report not ok. A partial bundle lacks the history the budget and lifecycle
    rules need, so it is not."""
    stream = io.BytesIO(source) if isinstance(source, bytes) else source
    header, first = _header(stream)
    check = _Verifier(header, journal_key, witness_keys)
    check.sealed.update(first)
    sealing = _Behind(check.sealed.update, 1)  # the seal's hash, on another core
    lines = _Lines(stream, sealing.put)
    audit = _SeparateAudit.start(stream) if check.whole else None
    if audit is not None:
        check.auditor = None  # the entries are audited in the other process
    try:
        try:
            trailer = _check_lines(lines, check, progress)
        finally:
            sealing.close()
        report = check.finish(trailer, len(witness_keys), audit)
    finally:
        if audit is not None:
            audit.stop()
    if progress is not None:
        progress(check.size, check.size)
    return report


def _check_lines(
    lines: _Lines, check: _Verifier, progress: Progress | None
) -> dict[str, Any] | None:
    """Every line after the header through :class:`_Verifier`; the trailer, if any."""
    next_report = _PROGRESS_EVERY
    plain = check.plain if check.whole and check.raw else None
    for line in lines:
        if not line.endswith(b"\n"):
            raise BundleError(f"leaf/{check.leaves()}", "a line is cut short or too long")
        if plain is not None and plain(line):
            if progress is not None and check.leaves() >= next_report:
                progress(check.leaves(), check.size)
                next_report += _PROGRESS_EVERY
            continue
        check.flush()
        obj, state = _read_line(line, check.tree.size, check.raw)
        kind = obj.get("kind")
        if kind == "seal":
            if not lines.last():
                raise BundleError("seal", "there is more after the trailer")
            lines.seal_before_this()
            return obj
        if kind == "gap":
            check.gap(obj)
        elif kind == "entry":
            check.entry(_entry(obj, state, check.tree.size), obj["prev_hash"])
        else:
            raise BundleError(
                f"leaf/{check.tree.size}", "a line that is neither an entry nor a gap"
            )
        if progress is not None and check.tree.size >= next_report:
            progress(check.tree.size, check.size)
            next_report += _PROGRESS_EVERY
    return None


_BLOCK = 64 << 10


class _Lines:
    """The lines after the header, read a block at a time (bounded memory: a block and
    one line); each line is given to ``seal`` once the loop is past it, a block at
    a time, except the trailer (:meth:`seal_before_this`, when the loop stops at it). A
    line longer than :data:`MAX_LINE`, or the last one without its newline, is yielded
    without its newline (cut short)."""

    def __init__(self, stream: IO[bytes], seal: Callable[[Any], object]) -> None:
        self._stream = stream
        self._seal = seal
        self._block = b""
        self._start = self._next = 0  # the line being looked at: block[start:next]

    def __iter__(self) -> Iterator[bytes]:
        carry = b""  # the start of a line the block before did not end
        while True:
            data = self._stream.read(_BLOCK)
            if not data:
                if carry:
                    self._block, self._start, self._next = carry, 0, len(carry)
                    yield carry
                return
            block = carry + data if carry else data
            end = block.rfind(b"\n") + 1  # the block's complete lines: block[:end]
            if end == 0:
                if len(block) > MAX_LINE:
                    self._block, self._start, self._next = block, 0, MAX_LINE
                    yield block[:MAX_LINE]
                    return
                carry = block
                continue
            self._block = block
            position = 0
            find = block.find
            while position < end:
                nl = find(b"\n", position, end) + 1
                self._start, self._next = position, nl
                if nl - position > MAX_LINE:
                    yield block[position : position + MAX_LINE]
                    return
                yield block[position:nl]
                position = nl
            self._seal(memoryview(block)[:end])  # none of them was the trailer
            carry = block[end:]

    def seal_before_this(self) -> None:
        """Hash the lines of this block before the one being looked at (the trailer)."""
        self._seal(memoryview(self._block)[: self._start])

    def last(self) -> bool:
        """Whether nothing follows the line being looked at."""
        return self._next == len(self._block) and not self._stream.read(1)


# A whole bundle of at least this many bytes (in a regular file) is audited in a
# process of its own, beside the checks of this one (tests set it to 0).
PARALLEL_AUDIT_BYTES = 16 << 20


def _reopen(fd: int) -> IO[bytes]:
    """The bundle's file again, with an offset of its own (the same file even if its
    name was since given to another: Linux's /proc/self/fd)."""
    return open(f"/proc/self/fd/{fd}", "rb")


def _audit_lines(fd: int, conn: Any) -> None:
    """The other process: the semantic audit of every entry line, in order, read as
    :func:`verify_bundle` reads them, and the SHA-256 of what it read before the
    trailer (header included), so the checking process knows the audit read the very
    bytes the seal covers. Sends ``(digest, report)``, or ``(None, why)``."""
    try:
        with _reopen(fd) as stream:
            header, first = _header(stream)
            raw = header["format"] == BUNDLE_FORMAT
            sealed = hashlib.sha256(first)
            auditor = Auditor()
            apply, loads, marker, skip = auditor.apply, _loads, _STATE, _STATE_SKIP
            lines = _Lines(stream, sealed.update)
            for line in lines:
                # _read_line's reading, inline for the common line (the hot path): the
                # values the checking process checks there and in _entry
                cut = line.find(marker) if raw else -1
                if cut >= 0:
                    obj = loads(line[:cut] + b"}")
                    apply(obj["position"], obj["topic"], line[cut + skip : -2])
                    continue
                obj, state = _read_line(line, 0, raw)
                kind = obj.get("kind")
                if kind == "entry" and state is not None:  # (else refused there)
                    if isinstance(state, str):
                        state = binascii.a2b_base64(state, strict_mode=True)
                    apply(obj["position"], obj["topic"], state)
                elif kind == "seal":
                    lines.seal_before_this()
                    break
            conn.send((sealed.digest(), auditor.finish()))
    except BaseException as e:  # noqa: BLE001 - reported to the checking process
        conn.send((None, f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


class _SeparateAudit:
    """The semantic audit of a whole bundle run in a forked process while this one
    checks the chain, the tree, the keys and the seal: the two halves of the work on
    two cores (as the chain walk's chunks are). Its report counts only if the digest of
    what it read is the sealed digest this process verified."""

    def __init__(self, process: Any, conn: Any) -> None:
        self._process = process
        self._conn = conn

    @classmethod
    def start(cls, stream: IO[bytes]) -> _SeparateAudit | None:
        """The audit of the bundle in ``stream``'s file, started; None where it is not
        a regular file of at least :data:`PARALLEL_AUDIT_BYTES` (audited here)."""
        try:
            fd = stream.fileno()
            info = os.fstat(fd)
        except (AttributeError, OSError, io.UnsupportedOperation):
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_size < PARALLEL_AUDIT_BYTES:
            return None
        if not os.path.exists(f"/proc/self/fd/{fd}"):
            return None
        context = multiprocessing.get_context("fork")
        mine, theirs = context.Pipe(duplex=False)
        process = context.Process(target=_audit_lines, args=(fd, theirs), daemon=True)
        process.start()
        theirs.close()
        return cls(process, mine)

    def result(self, sealed: bytes) -> AuditReport:
        """The audit's report, once it read exactly the bytes whose digest is ``sealed``."""
        try:
            digest, report = self._conn.recv()
        except (EOFError, OSError) as e:
            raise UnavailableError(f"the bundle's semantic audit did not finish: {e}") from e
        if digest is None:
            raise UnavailableError(f"the bundle's semantic audit did not finish: {report}")
        if digest != sealed:
            raise BundleError(
                "seal",
                "the bundle's file changed while it was verified: the audit did not read "
                "the bytes the seal covers",
            )
        return report  # type: ignore[no-any-return]

    def stop(self) -> None:
        self._conn.close()
        if self._process.is_alive():
            self._process.kill()
        self._process.join()


_sha256 = hashlib.sha256
_PUSH_EVERY = 256  # leaves :meth:`_Verifier.plain` checked, pushed into the tree at once


def _at(entry: BundleEntry) -> str:
    return f"entry/{entry.position}"


class _Verifier:
    """The state of one bundle's verification: O(log n) hashes for the tree, the seal's
    running hash, the grant chains, and the audit's books for a whole bundle."""

    def __init__(
        self, header: dict[str, Any], journal_key: NoteKey, witness_keys: Sequence[NoteKey]
    ) -> None:
        self.lineage, self.start, self.stop = _selection(header["selection"])
        self.whole = self.lineage is None and self.start is None and self.stop is None
        self.keys = _Keys(header["keys"], journal_key)
        self.checkpoint = _checkpoint(header["checkpoint"], self.keys, witness_keys)
        self.size = self.checkpoint.size
        self.sealed = hashlib.sha256()
        self.tree = merkle.CompactRange()
        self.grants = _Grants()
        self.auditor = Auditor() if self.whole else None
        self.counts = {"entries": 0, "context": 0, "gaps": 0}
        self.linked = False  # whether the leaf before is an entry of the bundle
        self.last_position = 0
        self.last_chain = ""
        self.gap_before = False
        self.raw = header["format"] == BUNDLE_FORMAT  # entry lines embed their state
        self._pending: list[bytes] = []  # leaf hashes :meth:`plain` has not pushed yet
        self._plain_topics: dict[str, bytes | None] = {}

    def leaves(self) -> int:
        return self.tree.size + len(self._pending)

    def flush(self) -> None:
        """Push the leaves :meth:`plain` checked into the tree."""
        if self._pending:
            self.tree.push_leaves(self._pending)
            self._pending.clear()

    def plain(self, line: bytes) -> bool:
        """A whole v4 bundle's entry line of the common kind (its state embedded, not a
        context entry, not of a type the keys or the grants read), read as
        :func:`_read_line` reads it and checked as :meth:`entry` checks :func:`_entry`'s
        entry: True if every check passes; False, having changed nothing, where the
        general path must look at it (and name what fails). The hot path of a whole
        bundle: no call per check, the leaves pushed a block at a time."""
        cut = line.find(_STATE)
        try:
            obj: Any = _loads(line[:cut] + b"}") if cut >= 0 and line.endswith(b"}\n") else None
            get = obj.get  # a line not of an object has none
        except (orjson.JSONDecodeError, AttributeError):
            return False
        stored = line[cut + _STATE_SKIP : -2]
        position, leaf, version = get("position"), get("leaf"), get("version")
        topic, originator = get("topic"), get("originator")
        chain_hash, prev_hash = get("chain_hash"), get("prev_hash")
        if not (
            len(obj) == _ENTRY_SIZE
            and get("context") is False
            and get("kind") == "entry"
            and type(position) is int
            and type(leaf) is int
            and type(version) is int
            and type(topic) is str
            and type(originator) is str
            and type(chain_hash) is str
            and type(prev_hash) is str
            and leaf == self.tree.size + len(self._pending)
            and leaf < self.size
            and self.last_position < position < 2**64
            and -(2**63) <= version < 2**63
            and len(chain_hash) == 64
            and len(prev_hash) == 64
            and len(originator) < 2**17
        ):
            return False
        encoded = self._plain_topics.get(topic, b"")
        if encoded == b"":
            plain = topic.partition("/")[0] not in (_ROTATION, "GrantMinted", "AgentRegistered")
            encoded = self._plain_topics[topic] = topic.encode() if plain else None
        try:
            raw = bytes.fromhex(originator)
            prev = bytes.fromhex(prev_hash)
        except ValueError:
            return False
        # linked, prev_hash must be the last chain hash (a hexdigest: lower-case hex)
        if (
            encoded is None
            or raw.hex() != originator
            or (prev_hash != self.last_chain if self.linked else prev.hex() != prev_hash)
        ):
            return False
        frame = entry_frame(prev, position, raw, version, encoded, stored)
        if _sha256(frame).hexdigest() != chain_hash:
            return False
        pending = self._pending
        pending.append(_sha256(LEAF_PREFIX + frame).digest())
        if len(pending) >= _PUSH_EVERY:
            self.flush()
        if self.auditor is not None:
            self.auditor.apply(position, topic, stored)
        self.counts["entries"] += 1
        self.linked, self.last_position, self.gap_before = True, position, False
        self.last_chain = chain_hash
        return True

    def gap(self, obj: dict[str, Any]) -> None:
        if self.whole:
            raise BundleError(
                "selection",
                f"a bundle of the whole journal holds every leaf, but leaves "
                f"{obj.get('start')}… are omitted",
            )
        _gap(obj, self.tree, self.size, self.gap_before)
        self.counts["gaps"] += 1
        self.linked, self.gap_before = False, True

    def entry(self, entry: BundleEntry, prev_hex: str) -> None:
        if entry.leaf != self.tree.size or entry.leaf >= self.size:
            raise BundleError(
                f"entry/{entry.position}",
                f"it is at leaf {entry.leaf}, but the next leaf of the tree of {self.size} "
                f"is {self.tree.size} (an entry was dropped, added or moved)",
            )
        frame = entry.frame()
        if _sha256(frame).hexdigest() != entry.chain_hash:  # lower-case hex too
            raise BundleError(_at(entry), "its stored bytes do not match its chain hash")
        if self.linked:
            if prev_hex != self.last_chain:
                raise BundleError(
                    _at(entry), "it does not link to the entry before it in the bundle"
                )
        elif entry.prev_hash.hex() != prev_hex:
            raise BundleError(_at(entry), "its prev_hash is not lower-case hex")
        if entry.position <= self.last_position:
            raise BundleError(_at(entry), "its position is not after the entry before it")
        self.tree.push(0, merkle_leaf_hash(frame))
        if not self.whole:
            _selected(entry, self.lineage, self.start, self.stop)
        elif entry.context:
            raise BundleError(_at(entry), "a bundle of the whole journal has no context entries")
        type_name = entry.topic.partition("/")[0]
        if type_name == _ROTATION:
            self.keys.rotation(entry)
        elif type_name in ("GrantMinted", "AgentRegistered"):
            self.grants.add(entry)
        if self.auditor is not None:
            self.auditor.apply(entry.position, entry.topic, entry.state)
        self.counts["context" if entry.context else "entries"] += 1
        self.linked, self.last_position, self.gap_before = True, entry.position, False
        self.last_chain = entry.chain_hash

    def finish(
        self, trailer: dict[str, Any] | None, cosignatures: int, audit: _SeparateAudit | None
    ) -> BundleReport:
        self.flush()
        if self.tree.size != self.size:
            raise BundleError(
                "tree", f"the bundle covers {self.tree.size} leaves of the checkpoint's {self.size}"
            )
        if self.tree.root() != self.checkpoint.root:
            raise BundleError(
                "tree",
                "its entries and gaps do not rebuild the checkpoint's root (an entry's "
                "bytes or a gap's hashes were changed)",
            )
        self.keys.finish()
        _check_seal(
            trailer, self.sealed.digest(), self.counts, self.keys.history.note_key_for(self.size)
        )
        findings: tuple[Finding, ...] = ()
        if audit is not None:
            findings = audit.result(self.sealed.digest()).findings
        elif self.auditor is not None:
            findings = self.auditor.finish().findings
        return BundleReport(
            ok=not findings,
            entries=self.counts["entries"],
            context=self.counts["context"],
            gaps=self.counts["gaps"],
            checkpoint_size=self.size,
            cosignatures=cosignatures,
            grant_chains=self.grants.checked,
            audited=self.whole,
            findings=findings,
        )


def _checkpoint(text: Any, keys: _Keys, witness_keys: Sequence[NoteKey]) -> Checkpoint:
    try:
        if not isinstance(text, str):
            raise BundleError("checkpoint", "the checkpoint is not a string")
        note = SignedNote.parse(text)
        checkpoint = verify_checkpoint(note, keys.claimed_for(Checkpoint.parse(note.text).size))
        for witness in witness_keys:
            verify_cosignature(note, witness)
    except CharterError as e:
        if isinstance(e, BundleError):
            raise
        raise BundleError("checkpoint", str(e)) from e
    return checkpoint


def _gap(obj: dict[str, Any], tree: merkle.CompactRange, size: int, gap_before: bool) -> None:
    begin, end, hashes = obj.get("start"), obj.get("end"), obj.get("hashes")
    where = f"gap/{begin}"
    if set(obj) != {"end", "hashes", "kind", "start"} or not (
        isinstance(begin, int) and isinstance(end, int) and _int(begin) and _int(end)
    ):
        raise BundleError(where, "a gap line must be {end, hashes, kind, start}")
    if gap_before:
        raise BundleError(where, "two gaps in a row (a gap must be as long as it can be)")
    if begin != tree.size or not begin < end <= size:
        raise BundleError(where, f"the next leaf is {tree.size}, and a gap ends by {size}")
    keys = merkle.decompose(begin, end)
    if not isinstance(hashes, list) or len(hashes) != len(keys):
        raise BundleError(where, f"a gap of leaves [{begin}, {end}) has {len(keys)} hashes")
    try:
        for (level, _), digest in zip(keys, hashes, strict=True):
            tree.push(level, _hex(digest, 32))
    except ValueError as e:
        raise BundleError(where, f"a hash does not parse: {e}") from e


def _selected(entry: BundleEntry, lineage: str | None, start: int | None, stop: int | None) -> None:
    """A selected entry is one the selection selects; a context entry is of a context
    type (the selection's own claim, that no other entry is selected, is the seal's)."""
    where = f"entry/{entry.position}"
    if entry.context:
        if entry.type_name not in CONTEXT_TYPES:
            raise BundleError(where, f"a context entry of type {entry.type_name}")
        return
    if (start is not None and entry.position < start) or (
        stop is not None and entry.position > stop
    ):
        raise BundleError("selection", f"entry {entry.position} is outside the selection")
    if lineage is not None:
        try:
            payload = entry.payload()
        except (ValueError, KeyError, TypeError) as e:
            raise BundleError(where, f"its state does not decode: {e}") from e
        if not mentions(payload, lineage):
            raise BundleError("selection", f"entry {entry.position} does not name {lineage}")


def _check_seal(
    trailer: dict[str, Any] | None, digest: bytes, counts: Mapping[str, int], key: NoteKey
) -> None:
    """The trailer is last, counts what came before it, and its seal is ``key``'s (the
    journal key that signs the checkpoint) signature over the hash of every line before
    it."""
    if trailer is None:
        raise BundleError("seal", "the bundle has no trailer (it was cut short)")
    if set(trailer) != {"context", "entries", "gaps", "kind", "seal"}:
        raise BundleError("seal", "the trailer must be {context, entries, gaps, kind, seal}")
    if any(trailer[k] != v for k, v in counts.items()):
        raise BundleError("seal", f"the trailer counts {trailer}, the bundle holds {counts}")
    try:
        signature = base64.b64decode(str(trailer["seal"]), validate=True)
        VerifyKey(key.public_key).verify(seal_signing_input(digest), signature)
    except (BadSignatureError, ValueError, binascii.Error) as e:
        raise BundleError(
            "seal",
            "the bundle is not signed by the journal's key (a line was dropped, added, "
            "reordered or changed, or the bundle is unsealed)",
        ) from e
