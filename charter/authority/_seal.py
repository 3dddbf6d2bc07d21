"""Sealing: a grant is its canonical bytes signed by its issuer's custody key.

A root's ceiling grant is signed by the root's own custody key (whose public half is the
trust root in the directory); each child's grant is signed by its parent's custody key.
``verify_grant_chain`` checks a worker's chain back to the root with nothing but the grants and
the root's public key. Signatures are verified by libsodium (pynacl); its errors are
wrapped in ours. Keys are compared with ``hmac.compare_digest``.
"""

from __future__ import annotations

import hmac
import itertools
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, Self

from nacl.bindings import crypto_sign, crypto_sign_seed_keypair
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.signing import SigningKey, VerifyKey
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from charter.authority._fast import construct
from charter.authority._grant import Grant, check_invariants
from charter.authority.errors import (
    CustodyKeyMismatchError,
    ForeignRootError,
    GrantChainBrokenError,
    GrantExpiredError,
    GrantFormatError,
    GrantSignatureInvalidError,
)
from charter.core.framing import child_seed, grant_digest, grant_signing_input
from charter.core.lineage import Lineage

__all__ = [
    "SealedGrant",
    "seal",
    "verify_grant_chain",
    "check_custody",
    "derive_child_seed",
    "Signer",
    "grant_digest",
]


class SealedGrant(BaseModel):
    """A grant's canonical bytes and its issuer's Ed25519 signature over them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    body: bytes
    signature: bytes = Field(min_length=64, max_length=64)
    _grant: Grant = PrivateAttr()

    @model_validator(mode="after")
    def _parse(self) -> SealedGrant:
        self._grant = Grant.from_body(self.body)
        return self

    @classmethod
    def _trusted(cls, grant: Grant, body: bytes, signature: bytes) -> SealedGrant:
        """Built from a grant this process just encoded and signed (no re-parse)."""
        return construct(cls, {"body": body, "signature": signature}, {"_grant": grant})

    @property
    def grant(self) -> Grant:
        # Straight from pydantic's private-attribute dict: ``self._grant`` goes through
        # pydantic's __getattr__, ~14 µs a call, read several times per minted child.
        private = self.__pydantic_private__
        if private is None:  # every constructor sets it; None would be a bug here
            raise GrantFormatError("sealed grant was built without its parsed grant")
        grant: Grant = private["_grant"]
        return grant

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A re-validated copy: the parsed grant and digest are never carried over."""
        values = {"body": self.body, "signature": self.signature} | dict(update or {})
        return type(self)(**values)

    @cached_property
    def digest(self) -> bytes:
        """What names this sealed grant (see :func:`grant_digest`)."""
        return grant_digest(self.body, self.signature)

    def to_record(self) -> dict[str, str]:
        """The stored form: the body as text (exact bytes) and the signature in hex."""
        return {"body": self.body.decode("utf-8"), "signature": self.signature.hex()}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SealedGrant:
        try:
            return cls(
                body=str(record["body"]).encode("utf-8"),
                signature=bytes.fromhex(str(record["signature"])),
            )
        except (KeyError, ValueError) as e:
            raise GrantFormatError(f"not a sealed grant record: {e}") from e


class Signer:
    """A custody key in the form libsodium signs with (fast path for many mints)."""

    __slots__ = ("_secret", "public")

    def __init__(self, seed: bytes) -> None:
        self.public, self._secret = crypto_sign_seed_keypair(seed)

    @classmethod
    def from_key(cls, key: SigningKey) -> Signer:
        return cls(bytes(key))

    def seal(self, grant: Grant) -> SealedGrant:
        body = grant.canonical_body()
        signature = crypto_sign(grant_signing_input(body), self._secret)[:64]
        return SealedGrant._trusted(grant, body, signature)


def seal(grant: Grant, key: SigningKey) -> SealedGrant:
    """Sign ``grant`` with ``key`` (the issuer's custody key)."""
    return Signer.from_key(key).seal(grant)


def derive_child_seed(parent_key_seed: bytes, child: Lineage) -> bytes:
    """A child's custody-key seed, derived from its parent's key and its lineage.

    Deterministic so that minting stays a pure function, and so the key broker can
    re-derive a worker's key after a restart from its parent's. Whoever holds a parent's
    key can derive its descendants' keys, which grants nothing new: the parent can mint
    any authority for its subtree already.
    """
    return child_seed(parent_key_seed, str(child))


def check_custody(custody_public: bytes, expected: bytes, *, who: str) -> None:
    """Refuse unless the custody key's public half equals ``expected`` byte for byte."""
    if not hmac.compare_digest(custody_public, expected):
        raise CustodyKeyMismatchError(
            f"the custody key loaded for {who} does not match its trust root; refusing "
            "to act with it (restore the right key file in the Charter home)"
        )


def _verify_signature(sealed: SealedGrant, public_key: bytes, *, signer: str) -> None:
    try:
        VerifyKey(public_key).verify(grant_signing_input(sealed.body), sealed.signature)
    except (BadSignatureError, CryptoError, ValueError, TypeError) as e:
        raise GrantSignatureInvalidError(
            f"grant for {sealed.grant.lineage} is not signed by {signer}: it was forged "
            "or altered after sealing"
        ) from e


def verify_grant_chain(
    chain: Sequence[SealedGrant], root_public_key: bytes, *, now_ms: int | None = None
) -> Grant:
    """Verify a chain of grants from a root's ceiling grant down to a worker's; return
    the worker's grant. Uses only the grants and the root's public key.

    Each link must be issued by the previous grant's holder, name its digest, be signed
    by its key, and lie within it on every axis. With ``now_ms``, no grant may have
    expired.
    """
    if not chain:
        raise GrantChainBrokenError("an empty chain proves nothing; present the grants")
    first = chain[0].grant
    if not first.lineage.is_root:
        raise GrantChainBrokenError(
            f"a chain must start at a root's ceiling grant, not at {first.lineage}"
        )
    if not hmac.compare_digest(bytes.fromhex(first.subject_key), root_public_key):
        raise ForeignRootError(
            f"the chain's root grant for {first.lineage} is held by a different key than "
            "the root's trust root: it belongs to another root"
        )
    _verify_signature(chain[0], root_public_key, signer=f"the trust root of {first.lineage}")
    for above, below in itertools.pairwise(chain):
        parent, child = above.grant, below.grant
        if child.issuer != parent.lineage or child.lineage.parent != parent.lineage:
            raise GrantChainBrokenError(
                f"grant for {child.lineage} (issuer {child.issuer}) does not follow the "
                f"grant for {parent.lineage}"
            )
        digest = child.parent_digest or ""
        if not hmac.compare_digest(digest.encode(), above.digest.hex().encode()):
            raise GrantChainBrokenError(
                f"grant for {child.lineage} names a different parent grant than the one presented"
            )
        _verify_signature(below, bytes.fromhex(parent.subject_key), signer=str(parent.lineage))
        check_invariants(parent.terms, child.terms, remaining_fanout=parent.terms.fanout)
    if now_ms is not None:
        for sealed in chain:
            if sealed.grant.terms.expires_at_ms <= now_ms:
                raise GrantExpiredError(
                    f"grant for {sealed.grant.lineage} expired at "
                    f"{sealed.grant.terms.expires_at_ms} ms; ask its issuer for a new one"
                )
    return chain[-1].grant
