"""Held secrets at rest: sealed under the home's secrets key (never plaintext on disk),
refused when changed, moved to another name, opened with another home's key, or
readable by others."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from charter.authority import Clearance, GrantTerms, PermissionMode
from charter.core import Budget, KeyPermissionsError, TamperedError
from charter.core.errors import (
    SecretExistsError,
    SecretNotFoundError,
    SecretSealBrokenError,
    SecretSourceError,
)
from charter.core.secrets import HeldSecret, SecretStore, client_cert_from_pem
from charter.runner._caps import worker_caps

from ._creds_support import PKI

VALUE = b"sk-live-" + os.urandom(12).hex().encode()


def _bearer(name: str = "tok") -> HeldSecret:
    return HeldSecret(name, "bearer", ("api.example.com:8443",), value=VALUE)


def test_a_secret_is_sealed_at_rest_and_opens_with_the_homes_key(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "home")
    store.add(_bearer())
    sealed = (tmp_path / "home" / "secrets" / "tok.sealed").read_bytes()
    # Nothing of the value on disk, in any form the record could hold it.
    for form in (VALUE, base64.b64encode(VALUE), VALUE.hex().encode()):
        assert form not in sealed
    for path in (tmp_path / "home").rglob("*"):
        if path.is_file():
            assert VALUE not in path.read_bytes(), path
    # Private: the key and the sealed file 0600, their directories 0700.
    home = tmp_path / "home"
    private = {home / "keys" / "secrets.key": 0o600, home / "keys": 0o700,
               home / "secrets" / "tok.sealed": 0o600, home / "secrets": 0o700}  # fmt: skip
    for path, mode in private.items():
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    # Control: it opens, whole, with the key.
    opened = store.load("tok")
    assert (opened.value, opened.bound_to, opened.kind) == (
        VALUE,
        ("api.example.com:8443",),
        "bearer",
    )
    assert VALUE.decode() not in repr(opened)
    assert "value" not in opened.described()


def test_a_changed_or_moved_or_foreign_sealed_secret_is_refused(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "home")
    store.add(_bearer("tok"))
    store.add(_bearer("other"))
    path = tmp_path / "home" / "secrets" / "tok.sealed"
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit flipped
    with pytest.raises(SecretSealBrokenError) as err:
        store.load("tok")
    assert isinstance(err.value, TamperedError)
    path.write_bytes(good)
    assert store.load("tok").value == VALUE  # control
    # A sealed file moved to another secret's name: it names itself, so it is refused.
    (tmp_path / "home" / "secrets" / "other.sealed").write_bytes(good)
    with pytest.raises(SecretSealBrokenError, match="moved"):
        store.load("other")
    # Another home's key does not open this home's secrets.
    foreign = SecretStore(tmp_path / "home2")
    foreign.add(_bearer("x"))
    (tmp_path / "home2" / "secrets" / "tok.sealed").write_bytes(good)
    os.chmod(tmp_path / "home2" / "secrets" / "tok.sealed", 0o600)
    with pytest.raises(SecretSealBrokenError, match="does not open"):
        foreign.load("tok")


def test_store_refusals(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "home")
    with pytest.raises(SecretNotFoundError):
        store.load("tok")
    store.add(_bearer())
    with pytest.raises(SecretExistsError):
        store.add(_bearer())
    with pytest.raises(SecretNotFoundError):
        store.load("absent")
    os.chmod(tmp_path / "home" / "secrets" / "tok.sealed", 0o640)
    with pytest.raises(KeyPermissionsError):
        store.load("tok")
    with pytest.raises(SecretSourceError, match="printable"):
        store.add(HeldSecret("nl", "bearer", ("a.example.com",), value=b"line\n"))
    with pytest.raises(SecretSourceError, match="no destination"):
        store.add(HeldSecret("nowhere", "bearer", (), value=b"v"))
    with pytest.raises(SecretSourceError, match="--header"):
        store.add(HeldSecret("h", "header", ("a.example.com",), value=b"v", header="bad header"))
    store.remove("tok")
    assert store.names() == []


def test_a_client_certificate_file_must_hold_its_own_key(tmp_path: Path) -> None:
    pki = PKI()
    cert, key = pki.issue("client", server=False)
    _, other_key = pki.issue("someone-else", server=False)
    chain, pkcs8 = client_cert_from_pem(cert + key)
    assert chain.startswith(b"-----BEGIN CERTIFICATE-----")
    assert pkcs8.startswith(b"-----BEGIN PRIVATE KEY-----")
    with pytest.raises(SecretSourceError, match="not the first certificate's key"):
        client_cert_from_pem(cert + other_key)
    with pytest.raises(SecretSourceError, match="exactly one private key"):
        client_cert_from_pem(cert)
    with pytest.raises(SecretSourceError, match="no PEM certificate"):
        client_cert_from_pem(key)


def test_a_workers_egress_grant_names_its_grants_secrets() -> None:
    """The cell's path: a worker's sandbox is registered with its grant's secret names
    (names only), so the cell's broker presents exactly those."""
    now = 1_000_000
    terms = GrantTerms(
        tools=frozenset(), egress=frozenset({"api.example.com"}),
        secrets=frozenset({"b-token", "a-cert"}), clearance=Clearance.INTERNAL,
        mode=PermissionMode.DEFAULT, depth=0, fanout=0,
        budget=Budget.parse("tokens=5,wall=1h,cpu=1h,mem=64MiB,egress=1MB"),
        expires_at_ms=now + 60_000,
    )  # fmt: skip
    slot = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=256MiB,egress=10MB")
    caps = worker_caps(slot, terms.budget, None, terms, now)
    assert caps.egress.secrets == ("a-cert", "b-token")
    assert caps.egress.withhold_credentials is False
