"""The Charter home (``CHARTER_HOME``, default ``./.charter``) and its key store.

Private keys live only here, in files of mode 0600 inside a 0700 ``keys/`` directory;
never in the journal and never printed. A key file holds the 32-byte Ed25519 seed, hex.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from nacl.signing import SigningKey

from charter.core.errors import BadInputError, KeyNotFoundError, KeyPermissionsError, StateError

__all__ = ["KeyStore", "KeyNotFoundError", "KeyPermissionsError", "charter_home"]

_KEY_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


def charter_home() -> Path:
    """``$CHARTER_HOME``, else ``./.charter`` (not created here)."""
    return Path(os.environ.get("CHARTER_HOME") or ".charter").absolute()


class KeyStore:
    """Ed25519 signing keys by name, in ``<home>/keys/<name>.key``."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or charter_home()
        self.directory = self.home / "keys"

    def _path(self, name: str) -> Path:
        if not _KEY_NAME.fullmatch(name):
            raise BadInputError(
                f"key name {name!r}: use lower-case letters, digits, '.', '_' or '-'"
            )
        return self.directory / f"{name}.key"

    def exists(self, name: str) -> bool:
        return self._path(name).exists()

    def create(self, name: str) -> SigningKey:
        """Generate and store a new key; refuses to overwrite an existing one."""
        path = self._path(name)
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)
        key = SigningKey.generate()
        # O_EXCL: two concurrent creators cannot both believe they own the key.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise StateError(
                f"key {name!r} already exists at {path}; remove it first if you mean to replace it"
            ) from None
        with os.fdopen(fd, "w") as f:
            f.write(bytes(key).hex() + "\n")
        return key

    def remove(self, name: str) -> None:
        """Delete a key file (used to undo a key made by a step that then failed)."""
        self._path(name).unlink(missing_ok=True)

    def load(self, name: str) -> SigningKey:
        path = self._path(name)
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise KeyNotFoundError(
                f"no key {name!r} in {self.directory}; set CHARTER_HOME to the home that holds it"
            ) from None
        _refuse_shared(path, mode, "600")
        _refuse_shared(self.directory, self.directory.stat().st_mode, "700")
        try:
            seed = bytes.fromhex(path.read_text().strip())
            return SigningKey(seed)
        except ValueError as e:
            raise StateError(f"key file {path} is not a Charter key: {e}") from e


def _refuse_shared(path: Path, mode: int, private: str) -> None:
    """A key file, or the directory of keys, that group or others can reach is refused."""
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyPermissionsError(
            f"{path} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
            f"run: chmod {private} {path}"
        )
