"""Charter's workload identity: short-lived ES256 JWTs that outside verifiers accept.

The identity key is an ECDSA P-256 key (``cryptography``) kept in the home at
``<home>/keys/identity-es256.pem`` (PKCS#8, 0600), made on first use. Its public half is
published as a JWKS document (RFC 7517; ``charter keys publish``), with a ``kid`` that is
the key's RFC 7638 thumbprint, so any JOSE library (PyJWT, jose, a SPIFFE-style JWT-SVID
checker) verifies the tokens without Charter.

A token is minted by the egress broker for one connection, for the destination actually
dialed: ``aud`` is ``https://HOST:PORT`` of that dial, ``sub`` names the sandbox (and
the secret), ``iat``/``nbf``/``exp`` bound it to the secret's lifetime (at most an
hour, five minutes unless set), and ``jti`` is random. The signature is the raw
``r || s`` form JWS requires (RFC 7518 §3.4), not DER.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from pathlib import Path

import orjson
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from charter.core.errors import HomeUnusableError, KeyNotFoundError
from charter.core.home import charter_home, refuse_shared, write_ignore_file

__all__ = ["IdentityKey", "audience", "b64url"]

_FILE = "identity-es256.pem"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def audience(host: str, port: int) -> str:
    """The audience of a token for a dial of ``host:port``: ``https://host:port``, the
    name as the grant matches it (lower case, no trailing dot)."""
    name = host.lower().rstrip(".")
    shown = f"[{name}]" if ":" in name else name
    return f"https://{shown}:{port}"


class IdentityKey:
    """The home's ES256 identity key: mint tokens, publish the public key."""

    def __init__(self, private: ec.EllipticCurvePrivateKey) -> None:
        if not isinstance(private.curve, ec.SECP256R1):
            raise KeyNotFoundError("the identity key must be ECDSA P-256 (ES256)")
        self._private = private
        numbers = private.public_key().public_numbers()
        self._jwk = {
            "crv": "P-256",
            "kty": "EC",
            "x": b64url(numbers.x.to_bytes(32, "big")),
            "y": b64url(numbers.y.to_bytes(32, "big")),
        }
        # RFC 7638: the thumbprint hashes the required members, sorted, no whitespace.
        canonical = orjson.dumps(self._jwk, option=orjson.OPT_SORT_KEYS)
        self.kid = b64url(hashlib.sha256(canonical).digest())

    @classmethod
    def load_or_create(cls, home: Path | None = None) -> IdentityKey:
        """The home's identity key, made (0600, in the 0700 ``keys/``) if there is none."""
        home = home or charter_home()
        path = home / "keys" / _FILE
        try:
            if not path.exists():
                home.mkdir(mode=0o700, parents=True, exist_ok=True)
                write_ignore_file(home)
                path.parent.mkdir(mode=0o700, exist_ok=True)
                pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    pass  # another process made it first: use theirs
                else:
                    with os.fdopen(fd, "wb") as f:
                        f.write(pem)
            refuse_shared(path, path.stat().st_mode, "600")
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except OSError as e:
            raise HomeUnusableError(f"cannot use the identity key {path}: {e}") from e
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise KeyNotFoundError(f"{path} is not an ECDSA key")
        return cls(key)

    def jwks(self) -> dict[str, object]:
        """The public key as a JWKS document (what ``charter keys publish`` prints)."""
        return {"keys": [self._jwk | {"use": "sig", "alg": "ES256", "kid": self.kid}]}

    def mint(self, *, issuer: str, subject: str, aud: str, ttl_s: int, now_s: int) -> str:
        """A compact JWS: ES256 over ``{iss, sub, aud, iat, nbf, exp, jti}``."""
        header = {"alg": "ES256", "typ": "JWT", "kid": self.kid}
        claims = {
            "iss": issuer, "sub": subject, "aud": aud, "iat": now_s, "nbf": now_s,
            "exp": now_s + ttl_s, "jti": secrets.token_urlsafe(12),
        }  # fmt: skip
        signing_input = f"{b64url(orjson.dumps(header))}.{b64url(orjson.dumps(claims))}"
        der = self._private.sign(signing_input.encode("ascii"), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing_input}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"
