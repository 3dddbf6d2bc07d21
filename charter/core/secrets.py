"""Held secrets: credentials Charter keeps in its home so that no sandbox ever holds them.

A secret is a *name* a grant can list (its secrets axis), a *kind* that says how the
egress broker presents it, the destinations it is *bound to* (``--for``, in the one
egress vocabulary of :mod:`charter.core.destination`) and its value:

| kind          | what the broker does for a bound destination                        |
|---------------|---------------------------------------------------------------------|
| ``bearer``    | sends ``Authorization: Bearer VALUE`` on the request it forwards     |
| ``header``    | sends ``HEADER: VALUE`` (an API key: ``X-Api-Key``, …)               |
| ``client-cert``| presents the held certificate and key in its own TLS handshake      |
| ``identity``  | sends ``Authorization: Bearer JWT``, a short-lived ES256 token whose |
|               | audience is the destination dialed (:mod:`charter.core.identity`)    |

At rest each secret is one file ``<home>/secrets/<NAME>.sealed`` (0600, in a 0700
directory): the record as JSON sealed with PyNaCl's ``SecretBox`` (XSalsa20-Poly1305)
under the home's secrets key ``<home>/keys/secrets.key`` (32 random bytes, hex, 0600).
The key is a file of the home, never an entry of the journal, so a copy of the journal
(an export bundle, a backup of the database) carries no secret and no key to open one.
The record names itself, so a sealed file renamed to another secret's name is refused
(:class:`SecretSealBrokenError`), as is any byte changed on disk.

A secret's value is never printed: :meth:`HeldSecret.__repr__` and the listing show the
name, kind, header and bindings only.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import orjson
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from nacl.exceptions import CryptoError
from nacl.secret import SecretBox
from nacl.utils import random as random_bytes

from charter.core.destination import admits, axis_validator, check_destination
from charter.core.errors import (
    AxisValueError,
    HomeUnusableError,
    SecretExistsError,
    SecretNotFoundError,
    SecretSealBrokenError,
    SecretSourceError,
)
from charter.core.home import charter_home, refuse_shared, write_ignore_file

__all__ = [
    "SECRET_KINDS",
    "HeldSecret",
    "SecretKind",
    "SecretName",
    "SecretStore",
    "check_secret",
    "client_cert_from_pem",
]

SecretKind = Literal["bearer", "header", "client-cert", "identity"]
SECRET_KINDS: tuple[SecretKind, ...] = ("bearer", "header", "client-cert", "identity")

_SECRET = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,127}")
# A header name is an RFC 9110 token; its value visible ASCII and spaces (no CR, LF, NUL).
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
_VALUE = re.compile(rb"[\x20-\x7e\t]{1,8192}")
_FORMAT = 1
_KEY_FILE = "secrets.key"
_DIR = "secrets"


def check_secret(name: str) -> str:
    """A secret's name (never its value): a letter, then letters, digits, ``_ . -``."""
    if not _SECRET.fullmatch(name):
        raise AxisValueError(
            f"secret name {name[:80]!r}: start with a letter, then letters, digits, '_', "
            "'.' or '-' (at most 128 characters)"
        )
    return name


SecretName = Annotated[str, axis_validator(check_secret)]
"""A secret's name as a pydantic field (the grant's secrets axis, the broker's grant)."""


@dataclass(frozen=True, repr=False)
class HeldSecret:
    """One held secret, opened. ``value`` is the header value (bearer, header) or the
    client certificate chain's PEM; ``key`` the client certificate's private key PEM;
    ``ca`` an optional PEM bundle the broker trusts for the bound destinations instead
    of the system's store; ``ttl_s`` an identity token's lifetime. A frozen dataclass,
    not a pydantic model: it is never dumped, only sealed, and its repr hides the value."""

    name: str
    kind: SecretKind
    bound_to: tuple[str, ...]
    value: bytes = b""
    key: bytes = b""
    header: str = ""
    ca: bytes = b""
    issuer: str = ""
    ttl_s: int = 300
    created_ms: int = 0

    def __post_init__(self) -> None:
        _check(self)  # a constructed secret is one the broker can present as it is

    def __repr__(self) -> str:  # never the value
        return f"HeldSecret(name={self.name!r}, kind={self.kind!r}, bound_to={self.bound_to!r})"

    def binds(self, host: str, port: int) -> bool:
        """True when this secret is bound to ``host:port`` (the host actually dialed)."""
        return any(admits(entry, host, port) for entry in self.bound_to)

    def described(self) -> dict[str, object]:
        """What ``charter secret list`` shows: everything but the value and the key."""
        shown: dict[str, object] = {"name": self.name, "kind": self.kind}
        shown["for"] = list(self.bound_to)
        if self.header:
            shown["header"] = self.header
        if self.kind == "identity":
            shown["issuer"], shown["ttl_s"] = self.issuer, self.ttl_s
        if self.ca:
            shown["ca"] = "held"
        shown["created_ms"] = self.created_ms
        return shown

    def _record(self) -> bytes:
        return orjson.dumps({
            "v": _FORMAT, "name": self.name, "kind": self.kind, "for": list(self.bound_to),
            "value": base64.b64encode(self.value).decode(),
            "key": base64.b64encode(self.key).decode(), "header": self.header,
            "ca": base64.b64encode(self.ca).decode(), "issuer": self.issuer,
            "ttl_s": self.ttl_s, "created_ms": self.created_ms,
        })  # fmt: skip

    @staticmethod
    def _from_record(data: bytes) -> HeldSecret:
        r = orjson.loads(data)
        if r.get("v") != _FORMAT:
            raise ValueError(f"unknown sealed-secret format {r.get('v')!r}")
        return HeldSecret(
            name=r["name"], kind=r["kind"], bound_to=tuple(r["for"]),
            value=base64.b64decode(r["value"]), key=base64.b64decode(r["key"]),
            header=r["header"], ca=base64.b64decode(r["ca"]), issuer=r["issuer"],
            ttl_s=int(r["ttl_s"]), created_ms=int(r["created_ms"]),
        )  # fmt: skip


def client_cert_from_pem(pem: bytes) -> tuple[bytes, bytes]:
    """Split a PEM file holding a certificate chain and its private key into (chain PEM,
    key PEM as PKCS#8); refuses a file without both, or a key that is not the first
    certificate's."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as e:
        raise SecretSourceError(f"no PEM certificate in the client-certificate file: {e}") from e
    blocks = re.findall(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----.+?-----END [A-Z ]*PRIVATE KEY-----",
                        pem, re.DOTALL)  # fmt: skip
    if len(blocks) != 1:
        raise SecretSourceError(
            "a client-certificate file holds the certificate chain and exactly one private "
            f"key, in PEM; found {len(blocks)} keys"
        )
    try:
        key = serialization.load_pem_private_key(blocks[0], password=None)
    except (ValueError, TypeError) as e:
        raise SecretSourceError(
            f"the private key does not load (encrypted keys are not taken): {e}"
        ) from e
    ours = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    theirs = (
        certs[0]
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    if ours != theirs:
        raise SecretSourceError("the private key is not the first certificate's key")
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return chain, pkcs8


class SecretStore:
    """The held secrets of a Charter home, sealed at rest (see the module docstring)."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or charter_home()
        self.directory = self.home / _DIR
        self.key_path = self.home / "keys" / _KEY_FILE

    # the key -----------------------------------------------------------------------
    def _box(self, *, create: bool) -> SecretBox:
        try:
            if create and not self.key_path.exists():
                self._make_dirs()
                try:
                    fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    pass  # another writer made it first: use theirs
                else:
                    with os.fdopen(fd, "w") as f:
                        f.write(random_bytes(SecretBox.KEY_SIZE).hex() + "\n")
            mode = self.key_path.stat().st_mode
        except FileNotFoundError:
            raise SecretNotFoundError(
                f"no secrets key in {self.key_path.parent}: this home holds no secrets; "
                "add one with: charter secret add NAME …"
            ) from None
        except OSError as e:
            raise HomeUnusableError(f"cannot use the Charter home {self.home}: {e}") from e
        refuse_shared(self.key_path, mode, "600")
        try:
            return SecretBox(bytes.fromhex(self.key_path.read_text().strip()))
        except (ValueError, TypeError) as e:
            raise SecretSealBrokenError(f"{self.key_path} is not a secrets key: {e}") from e

    def _make_dirs(self) -> None:
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_ignore_file(self.home)
        for directory in (self.key_path.parent, self.directory):
            directory.mkdir(mode=0o700, exist_ok=True)
            os.chmod(directory, 0o700)

    def _path(self, name: str) -> Path:
        return self.directory / f"{check_secret(name)}.sealed"

    # writing -----------------------------------------------------------------------
    def add(self, secret: HeldSecret) -> None:
        """Seal and store ``secret``; refuses an existing name (remove it first)."""
        box = self._box(create=True)
        path = self._path(secret.name)
        sealed = bytes(box.encrypt(secret._record()))
        try:  # O_EXCL: two writers cannot both think they stored the name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise SecretExistsError(
                f"secret {secret.name!r} is held already; run: charter secret remove {secret.name}"
            ) from None
        except OSError as e:
            raise HomeUnusableError(f"cannot write {path}: {e}") from e
        with os.fdopen(fd, "wb") as f:
            f.write(sealed)

    def remove(self, name: str) -> None:
        path = self._path(name)
        try:
            path.unlink()
        except FileNotFoundError:
            raise SecretNotFoundError(f"no secret {name!r} in {self.directory}") from None

    # reading -----------------------------------------------------------------------
    def names(self) -> list[str]:
        try:
            entries = sorted(self.directory.iterdir())
        except FileNotFoundError:
            return []
        except OSError as e:
            raise HomeUnusableError(f"cannot read {self.directory}: {e}") from e
        return [p.name[: -len(".sealed")] for p in entries if p.name.endswith(".sealed")]

    def load(self, name: str) -> HeldSecret:
        """Open the secret ``name``; refuses a file readable by others, or one that does
        not open with the home's key or names another secret."""
        path = self._path(name)
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise SecretNotFoundError(
                f"no secret {name!r} in {self.directory}; add it with: charter secret add {name} …"
            ) from None
        refuse_shared(path, mode, "600")
        refuse_shared(self.directory, self.directory.stat().st_mode, "700")
        box = self._box(create=False)
        try:
            secret = HeldSecret._from_record(box.decrypt(path.read_bytes()))
        except CryptoError as e:
            raise SecretSealBrokenError(
                f"{path} does not open with the home's secrets key: changed on disk, or "
                "sealed under another key"
            ) from e
        except (ValueError, KeyError, TypeError) as e:
            raise SecretSealBrokenError(f"{path} opens but is not a sealed secret: {e}") from e
        if secret.name != name:
            raise SecretSealBrokenError(
                f"{path} holds the secret {secret.name!r}, not {name!r}: a sealed file was "
                "moved to another name"
            )
        return secret

    def load_many(self, names: Iterable[str]) -> dict[str, HeldSecret]:
        """The named secrets, opened (every one must exist)."""
        return {name: self.load(name) for name in sorted(set(names))}


def _check(secret: HeldSecret) -> None:
    """A secret that the broker could present as it is, or SecretSourceError."""
    check_secret(secret.name)
    if not secret.bound_to:
        raise SecretSourceError(
            f"secret {secret.name!r} is bound to no destination: give --for DESTINATION"
        )
    for entry in secret.bound_to:
        check_destination(entry)
    if secret.kind in ("bearer", "header") and not _VALUE.fullmatch(secret.value):
        raise SecretSourceError(
            f"secret {secret.name!r}: a header value is 1-8192 printable ASCII characters "
            "(no newline, NUL or other control byte); strip the trailing newline of its file"
        )
    if secret.kind == "header" and not _HEADER.fullmatch(secret.header):
        raise SecretSourceError(f"secret {secret.name!r}: give --header NAME (an HTTP token)")
    if secret.kind == "client-cert" and not (secret.value and secret.key):
        raise SecretSourceError(f"secret {secret.name!r}: a client certificate needs its key")
    if secret.kind == "identity" and not 1 <= secret.ttl_s <= 3600:
        raise SecretSourceError(
            f"secret {secret.name!r}: an identity token lives 1-3600 seconds (short-lived)"
        )
