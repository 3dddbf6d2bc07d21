"""Export bundles, and their offline verification (pure: no journal, no database).

A bundle is one canonical JSON document (sorted keys, no spaces, UTF-8)::

    {"format": "charter/bundle@v1",
     "selection": {"lineage": str|null, "from": int|null, "to": int|null},
     "keys": [{"after_leaf": int, "key": <verifier key text>}, ...],
     "checkpoint": <signed checkpoint note text, with any cosignatures>,
     "entries": [{"position", "originator" (hex), "version", "topic", "state" (base64),
                  "prev_hash" (hex), "chain_hash" (hex), "leaf", "path": [hex, ...],
                  "context": bool}, ...],
     "manifest": {"<part>": <hex sha256 of the part's canonical JSON>, ...},
     "seal": <base64 Ed25519 signature over seal_signing_input(manifest)>}

The parts of the manifest are ``selection``, ``keys``, ``checkpoint`` and
``entry/<position>``. Every entry carries its exact stored bytes and its RFC 6962
inclusion proof in the checkpoint's tree; ``context`` entries were added because the
grant chains of the selected lineages need them. :func:`verify_bundle` checks, in this
order, and names the first part that fails: the format, the manifest, the keys, the
checkpoint's signature, every entry (bytes → chain hash, links between adjacent leaves,
inclusion), the grant chains, the seal, then the semantic audit of the entries.

The seal is the exporter's signature, by the journal key that signs the checkpoint, over
the manifest: it covers the selection, the keys, the checkpoint and the list of entries,
and it is the exporter's claim that the bundle's (non-context) entries are every entry
of the checkpoint's tree that the selection selects. Dropping an entry with its manifest
line, or relabelling the selection, breaks it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

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
from charter.audit.semantic import Finding, audit_history
from charter.authority import SealedGrant, verify_grant_chain
from charter.core.errors import CharterError
from charter.core.framing import entry_frame, merkle_leaf_hash

__all__ = [
    "BUNDLE_FORMAT",
    "Bundle",
    "BundleEntry",
    "BundleReport",
    "canonical",
    "seal_signing_input",
    "verify_bundle",
]

BUNDLE_FORMAT = "charter/bundle@v2"  # v1 had no seal
_SEAL_CONTEXT = b"charter/bundle-seal/v1\x00"


def canonical(value: Any) -> bytes:
    """Canonical JSON: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


def _manifest(parts: Mapping[str, Any]) -> dict[str, str]:
    """The digest of each part, by name."""
    return {name: digest(part) for name, part in parts.items()}


def seal_signing_input(manifest: Mapping[str, str]) -> bytes:
    """``"charter/bundle-seal/v1" ‖ 0x00 ‖ SHA-256(canonical JSON of the manifest)``."""
    return _SEAL_CONTEXT + hashlib.sha256(canonical(dict(manifest))).digest()


class BundleEntry(BaseModel):
    """One journal entry as stored, with its inclusion proof."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    position: int
    originator: bytes
    version: int
    topic: str
    state: bytes
    prev_hash: bytes
    chain_hash: bytes
    leaf: int
    path: tuple[bytes, ...]
    context: bool = False

    def frame(self) -> bytes:
        return entry_frame(
            self.prev_hash,
            self.position,
            self.originator,
            self.version,
            self.topic.encode(),
            self.state,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "originator": self.originator.hex(),
            "version": self.version,
            "topic": self.topic,
            "state": base64.b64encode(self.state).decode(),
            "prev_hash": self.prev_hash.hex(),
            "chain_hash": self.chain_hash.hex(),
            "leaf": self.leaf,
            "path": [p.hex() for p in self.path],
            "context": self.context,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BundleEntry:
        return cls(
            position=data["position"],
            originator=bytes.fromhex(data["originator"]),
            version=data["version"],
            topic=data["topic"],
            state=base64.b64decode(data["state"], validate=True),
            prev_hash=bytes.fromhex(data["prev_hash"]),
            chain_hash=bytes.fromhex(data["chain_hash"]),
            leaf=data["leaf"],
            path=tuple(bytes.fromhex(p) for p in data["path"]),
            context=data["context"],
        )

    def payload(self) -> dict[str, Any]:
        """The event's payload, read from the stored canonical JSON."""
        data = json.loads(self.state)
        payload: dict[str, Any] = data["payload"]
        return payload

    @property
    def type_name(self) -> str:
        return self.topic.partition("/")[0]


class Bundle(BaseModel):
    """A parsed bundle (its parts, before any of them is trusted)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    selection: dict[str, Any]
    keys: tuple[dict[str, Any], ...]
    checkpoint: str
    entries: tuple[BundleEntry, ...]
    seal: bytes = b""

    def sealed(self, key: SigningKey) -> Bundle:
        """This bundle with its seal: ``key`` (the journal key that signs its
        checkpoint) signs its manifest."""
        signature = key.sign(seal_signing_input(self.manifest())).signature
        return self.model_copy(update={"seal": signature})

    def parts(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "selection": self.selection,
            "keys": list(self.keys),
            "checkpoint": self.checkpoint,
        }
        for entry in self.entries:
            out[f"entry/{entry.position}"] = entry.to_json()
        return out

    def manifest(self) -> dict[str, str]:
        return _manifest(self.parts())

    def to_bytes(self) -> bytes:
        parts = self.parts()  # each entry's JSON built once, for the manifest and the file
        return canonical(
            {
                "format": BUNDLE_FORMAT,
                "selection": self.selection,
                "keys": list(self.keys),
                "checkpoint": self.checkpoint,
                "entries": [parts[f"entry/{e.position}"] for e in self.entries],
                "manifest": _manifest(parts),
                "seal": base64.b64encode(self.seal).decode(),
            }
        )

    @classmethod
    def parse(cls, data: bytes) -> tuple[Bundle, dict[str, str]]:
        """The bundle and the manifest it carries (checked by :func:`verify_bundle`)."""
        bundle, manifest, _ = _parse(cls, data)
        return bundle, manifest


def _parse(cls: type[Bundle], data: bytes) -> tuple[Bundle, dict[str, str], dict[str, str]]:
    """The bundle, the manifest it carries, and the digest of each part as it stands in
    the file (each entry's JSON object as read, not re-encoded: a part is what was
    digested, byte for byte after canonical encoding)."""
    try:
        doc = json.loads(data)
        fmt = doc.get("format")
    except (ValueError, AttributeError) as e:
        raise BundleError("format", f"the bundle is not a JSON object: {e}") from e
    if fmt != BUNDLE_FORMAT:
        raise BundleError("format", f"not a {BUNDLE_FORMAT} bundle")
    try:
        bundle = cls(
            selection=doc["selection"],
            keys=tuple(doc["keys"]),
            checkpoint=doc["checkpoint"],
            entries=tuple(BundleEntry.from_json(e) for e in doc["entries"]),
            seal=base64.b64decode(doc["seal"], validate=True),
        )
        manifest = {str(k): str(v) for k, v in doc["manifest"].items()}
        parts = {
            "selection": doc["selection"],
            "keys": doc["keys"],
            "checkpoint": doc["checkpoint"],
        }
        for entry, raw in zip(bundle.entries, doc["entries"], strict=True):
            parts[f"entry/{entry.position}"] = raw
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as e:
        raise BundleError("format", f"the bundle does not parse: {e}") from e
    return bundle, manifest, _manifest(parts)


class BundleReport(BaseModel):
    """What ``export verify`` found (its ``--json`` document on success)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    entries: int
    context: int
    checkpoint_size: int
    cosignatures: int
    grant_chains: int
    audited: bool
    findings: tuple[Finding, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def verify_bundle(
    data: bytes,
    journal_key: NoteKey,
    *,
    witness_keys: Sequence[NoteKey] = (),
) -> BundleReport:
    """Verify a bundle offline; raise :class:`BundleError` naming the first bad part.

    A bundle of the whole journal (no lineage, no range) is also audited semantically
    (:mod:`charter.audit.semantic`); its findings make the report not ok. A partial
    bundle lacks the history the budget and lifecycle rules need, so it is not."""
    bundle, manifest, digests = _parse(Bundle, data)
    _check_manifest(digests, manifest)
    history = _check_keys(bundle, journal_key)
    checkpoint = _check_checkpoint(bundle, history, witness_keys)
    _check_entries(bundle, checkpoint)
    chains = _check_grant_chains(bundle)
    _check_seal(bundle, manifest, history.note_key_for(checkpoint.size))
    whole = all(bundle.selection.get(k) is None for k in ("lineage", "from", "to"))
    findings: tuple[Finding, ...] = ()
    if whole:
        rows = [(e.position, e.topic, e.state) for e in bundle.entries]
        findings = audit_history([rows]).findings
    return BundleReport(
        ok=not findings,
        entries=sum(not e.context for e in bundle.entries),
        context=sum(e.context for e in bundle.entries),
        checkpoint_size=checkpoint.size,
        cosignatures=len(witness_keys),
        grant_chains=chains,
        audited=whole,
        findings=findings,
    )


def _check_manifest(expected: Mapping[str, str], manifest: Mapping[str, str]) -> None:
    for name in sorted(expected.keys() | manifest.keys()):
        if manifest.get(name) != expected.get(name):
            raise BundleError(
                f"manifest/{name}",
                "the manifest's digest does not match the part (the part or the manifest "
                "was changed, or a part was added or removed)",
            )


def _check_seal(bundle: Bundle, manifest: Mapping[str, str], key: NoteKey) -> None:
    """The manifest (checked against the parts already) is signed by ``key``, the
    journal key that signs the checkpoint."""
    try:
        VerifyKey(key.public_key).verify(seal_signing_input(manifest), bundle.seal)
    except (BadSignatureError, ValueError) as e:
        raise BundleError(
            "seal",
            "the manifest is not signed by the journal's key (an entry was dropped with "
            "its manifest line, the selection relabelled, or the bundle is unsealed)",
        ) from e


def _check_keys(bundle: Bundle, anchor: NoteKey) -> KeyHistory:
    """The key history the bundle claims, from ``anchor`` through each rotation entry
    it carries (whose bytes and proof ``_check_entries`` verifies)."""
    by_leaf = {e.leaf: e for e in bundle.entries}
    history = KeyHistory.start(anchor.name, anchor.public_key)
    claimed = list(bundle.keys)
    first = claimed[0] if claimed else {}
    if first.get("key") != anchor.text() or first.get("after_leaf") != -1:
        raise BundleError(
            "keys", f"the bundle's key history does not start at the key given ({anchor.text()})"
        )
    for item in claimed[1:]:
        leaf = item.get("after_leaf")
        entry = by_leaf.get(leaf) if isinstance(leaf, int) else None
        if entry is None or entry.type_name != "JournalKeyRotated":
            raise BundleError("keys", f"no rotation entry in the bundle at leaf {leaf}")
        try:
            history = history.rotated(entry.leaf, entry.payload())
        except (CharterError, ValueError) as e:
            raise BundleError("keys", f"the rotation at leaf {leaf} does not verify: {e}") from e
        if history.note_key_for(entry.leaf + 1).text() != item.get("key"):
            raise BundleError("keys", f"the key after leaf {leaf} is not the one rotated to")
    return history


def _check_checkpoint(
    bundle: Bundle, history: KeyHistory, witness_keys: Sequence[NoteKey]
) -> Checkpoint:
    try:
        note = SignedNote.parse(bundle.checkpoint)
        key = history.note_key_for(Checkpoint.parse(note.text).size)
        checkpoint = verify_checkpoint(note, key)
        for witness in witness_keys:
            verify_cosignature(note, witness)
    except CharterError as e:
        raise BundleError("checkpoint", str(e)) from e
    return checkpoint


def _check_entries(bundle: Bundle, checkpoint: Checkpoint) -> None:
    by_leaf = {e.leaf: e for e in bundle.entries}
    for entry in bundle.entries:
        where = f"entry/{entry.position}"
        frame = entry.frame()
        if hashlib.sha256(frame).digest() != entry.chain_hash:
            raise BundleError(where, "its stored bytes do not match its chain hash")
        before = by_leaf.get(entry.leaf - 1)
        if before is not None and before.chain_hash != entry.prev_hash:
            raise BundleError(where, "it does not link to the entry before it in the bundle")
        if before is not None and before.position >= entry.position:
            raise BundleError(where, "its position is not after the entry before it")
        try:
            merkle.verify_inclusion(
                merkle_leaf_hash(frame), entry.leaf, checkpoint.size, entry.path, checkpoint.root
            )
        except CharterError as e:
            raise BundleError(f"{where}/proof", str(e)) from e


def _check_grant_chains(bundle: Bundle) -> int:
    """Every lineage with a minted grant in the bundle: its chain, root to it, verifies
    to the root's trust root (from the root's AgentRegistered entry in the bundle)."""
    grants: dict[str, tuple[BundleEntry, SealedGrant]] = {}
    roots: dict[str, bytes] = {}
    for entry in bundle.entries:
        where = f"entry/{entry.position}"
        try:
            payload = entry.payload()
            if entry.type_name == "GrantMinted":
                sealed = SealedGrant.from_record(
                    {"body": payload["body"], "signature": payload["signature"]}
                )
                grants[str(payload["lineage"])] = (entry, sealed)
            elif entry.type_name == "AgentRegistered":
                roots[str(payload["lineage"])] = bytes.fromhex(payload["trust_root"])
        except (ValueError, KeyError, TypeError, ValidationError, CharterError) as e:
            raise BundleError(where, f"its payload does not decode: {e}") from e
    for lineage in sorted(grants):
        chain: list[SealedGrant] = []
        node: str | None = lineage
        while node is not None:
            found = grants.get(node)
            if found is None:
                raise BundleError(
                    f"grants/{lineage}", f"the grant of {node} (an ancestor) is not in the bundle"
                )
            chain.append(found[1])
            node = node.rpartition("/")[0] if "/" in node else None
        chain.reverse()
        root = chain[0].grant.lineage
        trust_root = roots.get(str(root))
        if trust_root is None:
            raise BundleError(f"grants/{lineage}", f"the root {root}'s registration is missing")
        try:
            verify_grant_chain(chain, trust_root)
        except CharterError as e:
            raise BundleError(f"grants/{lineage}", str(e)) from e
    return len(grants)
