"""The cell's custody of its workers' keys: derived from committed grants, issued to the
worker's sandbox through the key broker, never handed over in-process.

A worker's custody seed is its root's (from the home) derived down its lineage
(``derive_child_seed``), and is used only if its public key is the subject key of the
worker's committed grant (fail closed). The key is issued to the sandbox id the pool
registered with the broker, so the handle dies with that sandbox.
"""

from __future__ import annotations

import contextlib
import hmac
import threading

from nacl.signing import SigningKey

from charter.authority import SealedGrant, derive_child_seed
from charter.control import custody_key_name
from charter.core import KeyStore, Lineage
from charter.runner.errors import NotAWorkerError
from charter.sandbox import KeyBroker

__all__ = ["Custody", "custody_seed"]


def custody_seed(
    keys: KeyStore, lineage: str, grant: SealedGrant | None, *, root: bytes | None = None
) -> bytes:
    """The custody seed of ``lineage`` whose committed grant is ``grant`` (refused when
    there is none, or when the derived key is not the grant's subject key). ``root``:
    its root's custody seed as read already (else read from the home now)."""
    parts = lineage.split("/")
    seed = root if root is not None else root_seed(keys, lineage)
    for i in range(1, len(parts)):
        seed = derive_child_seed(seed, Lineage("/".join(parts[: i + 1])))
    public = bytes(SigningKey(seed).verify_key)
    if grant is None or not hmac.compare_digest(public, bytes.fromhex(grant.grant.subject_key)):
        raise NotAWorkerError(f"{lineage} has no committed grant for the key derived here")
    return seed


def root_seed(keys: KeyStore, lineage: str) -> bytes:
    """The custody seed of ``lineage``'s root, read from the home's key file."""
    return bytes(keys.load(custody_key_name(Lineage(lineage.split("/", maxsplit=1)[0]).root_name)))


class Custody:
    """Key handles by lineage, each issued to that worker's sandbox. The roots' custody
    seeds are read from the home once per cell incarnation (each start read the key
    file, checked its mode and parsed it: about half of the key's issue), and read
    again when a key derived from one is not its grant's (the file was replaced)."""

    def __init__(self, keys: KeyStore, broker: KeyBroker) -> None:
        self.keys = keys
        self.broker = broker
        self._lock = threading.Lock()
        self._handles: dict[str, str] = {}  # lineage -> key handle
        self._roots: dict[str, bytes] = {}  # root lineage -> its custody seed, as read

    def _seed(self, lineage: str, grant: SealedGrant | None) -> bytes:
        root = lineage.split("/", maxsplit=1)[0]
        with self._lock:
            known = self._roots.get(root)
        if known is not None:
            with contextlib.suppress(NotAWorkerError):  # else: the file, read afresh
                return custody_seed(self.keys, lineage, grant, root=known)
        fresh = root_seed(self.keys, lineage)
        seed = custody_seed(self.keys, lineage, grant, root=fresh)  # refused: raised
        with self._lock:
            self._roots[root] = fresh
        return seed

    def issue(self, lineage: str, grant: SealedGrant | None, sandbox_id: str) -> str:
        """Issue ``lineage``'s key to the registered sandbox ``sandbox_id``."""
        seed = bytearray(self._seed(lineage, grant))
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
