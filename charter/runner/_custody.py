"""The cell's custody of its workers' keys: derived from committed grants, issued to the
worker's sandbox through the key broker, never handed over in-process.

A worker's custody seed is its root's (from the home) derived down its lineage
(``derive_child_seed``), and is used only if its public key is the subject key of the
worker's committed grant (fail closed). The key is issued to the sandbox id the pool
registered with the broker, so the handle dies with that sandbox.
"""

from __future__ import annotations

import hmac
import threading

from nacl.signing import SigningKey

from charter.authority import SealedGrant, derive_child_seed
from charter.control import custody_key_name
from charter.core import KeyStore, Lineage
from charter.runner.errors import NotAWorkerError
from charter.sandbox import KeyBroker

__all__ = ["Custody", "custody_seed"]


def custody_seed(keys: KeyStore, lineage: str, grant: SealedGrant | None) -> bytes:
    """The custody seed of ``lineage`` whose committed grant is ``grant`` (refused when
    there is none, or when the derived key is not the grant's subject key)."""
    parts = lineage.split("/")
    seed = bytes(keys.load(custody_key_name(Lineage(parts[0]).root_name)))
    for i in range(1, len(parts)):
        seed = derive_child_seed(seed, Lineage("/".join(parts[: i + 1])))
    public = bytes(SigningKey(seed).verify_key)
    if grant is None or not hmac.compare_digest(public, bytes.fromhex(grant.grant.subject_key)):
        raise NotAWorkerError(f"{lineage} has no committed grant for the key derived here")
    return seed


class Custody:
    """Key handles by lineage, each issued to that worker's sandbox."""

    def __init__(self, keys: KeyStore, broker: KeyBroker) -> None:
        self.keys = keys
        self.broker = broker
        self._lock = threading.Lock()
        self._handles: dict[str, str] = {}  # lineage -> key handle

    def issue(self, lineage: str, grant: SealedGrant | None, sandbox_id: str) -> str:
        """Issue ``lineage``'s key to the registered sandbox ``sandbox_id``."""
        seed = bytearray(custody_seed(self.keys, lineage, grant))
        handle = self.broker.issue(seed, sandbox_id=sandbox_id)
        with self._lock:
            self._handles[lineage] = handle
        return handle

    def sign(self, lineage: str, tag: str, message: bytes, sandbox_id: str) -> bytes:
        """Sign for ``lineage`` with the key issued to its sandbox (and only that one)."""
        with self._lock:
            handle = self._handles.get(lineage)
        if handle is None:
            raise NotAWorkerError(f"{lineage} holds no key here")
        return self.broker.sign(handle, tag, message, sandbox_id=sandbox_id)

    def release(self, lineage: str) -> None:
        """Wipe ``lineage``'s key, if it holds one."""
        with self._lock:
            handle = self._handles.pop(lineage, None)
        if handle is not None:
            self.broker.release(handle)
