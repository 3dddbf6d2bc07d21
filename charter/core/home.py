"""The Charter home and its key store.

The home is ``$CHARTER_HOME``, else the nearest ``.charter/`` found walking up from the
current directory (the way git finds ``.git``), else a per-user data directory
(``$XDG_DATA_HOME/charter``, else ``~/.local/share/charter``). Private keys live only
here, in files of mode 0600 inside a 0700 ``keys/`` directory; never in the journal and
never printed. A key file holds the 32-byte Ed25519 seed, hex. A home holds a
``.gitignore`` of ``*``, so that ``git add -A`` never stages its keys.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from nacl.signing import SigningKey

from charter.core.errors import (
    BadInputError,
    HomeUnusableError,
    KeyNotFoundError,
    KeyPermissionsError,
    StateError,
)

__all__ = [
    "HOME_DIR_NAME",
    "KeyStore",
    "KeyNotFoundError",
    "KeyPermissionsError",
    "charter_home",
    "find_home",
]

_KEY_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")

HOME_DIR_NAME = ".charter"
_IGNORE_FILE = ".gitignore"
_IGNORE_ALL = "# Charter's home: private keys and the journal; never commit it.\n*\n"


def find_home(start: Path) -> Path | None:
    """The nearest ``.charter`` directory in ``start`` or one of its parents."""
    for directory in (start, *start.parents):
        candidate = directory / HOME_DIR_NAME
        try:
            if candidate.is_dir():
                return candidate
        except OSError:  # a parent this user may not look into: keep walking up
            continue
    return None


def _user_data_home(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():  # the XDG spec: a relative value is ignored
        return Path(xdg) / "charter"
    try:
        return Path.home() / ".local" / "share" / "charter"
    except RuntimeError:  # no HOME and no password entry
        raise HomeUnusableError(
            "cannot tell where the per-user Charter home is (HOME is not set); set "
            "CHARTER_HOME to a directory"
        ) from None


def charter_home(cwd: Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """``$CHARTER_HOME``, else the nearest ``.charter/`` walking up from ``cwd``, else
    the per-user data directory (not created here). A home that exists but is not a
    directory is refused here, before anything reads from or writes into it."""
    env = os.environ if env is None else env
    explicit = env.get("CHARTER_HOME")
    if explicit:
        home = Path(explicit).absolute()
    else:
        home = find_home((cwd or Path.cwd()).absolute()) or _user_data_home(env)
    try:
        usable = home.is_dir() or not home.exists()
    except OSError:  # may not look: said when the home is used (a --db reader never is)
        return home
    if not usable:
        raise HomeUnusableError(
            f"the Charter home {home} is not a directory; set CHARTER_HOME to a directory"
        )
    return home


def write_ignore_file(home: Path) -> None:
    """Keep everything in ``home`` out of version control (git reads ``.gitignore`` in
    any directory, so ``*`` there covers the keys and the journal)."""
    path = home / _IGNORE_FILE
    if not path.exists():
        path.write_text(_IGNORE_ALL)


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
        path = self._path(name)
        try:
            return path.exists()
        except OSError as e:  # exists() only hides "not there", not "may not look"
            raise HomeUnusableError(f"cannot read the Charter home {self.home}: {e}") from e

    def create(self, name: str) -> SigningKey:
        """Generate and store a new key; refuses to overwrite an existing one."""
        path = self._path(name)
        try:
            self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_ignore_file(self.home)
            self.directory.mkdir(mode=0o700, exist_ok=True)
        except OSError as e:
            raise HomeUnusableError(f"cannot use the Charter home {self.home}: {e}") from e
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
        except OSError as e:
            raise HomeUnusableError(f"cannot read the Charter home {self.home}: {e}") from e
        refuse_shared(path, mode, "600")
        refuse_shared(self.directory, self.directory.stat().st_mode, "700")
        try:
            seed = bytes.fromhex(path.read_text().strip())
            return SigningKey(seed)
        except OSError as e:
            raise HomeUnusableError(f"cannot read the key file {path}: {e}") from e
        except ValueError as e:
            raise StateError(f"key file {path} is not a Charter key: {e}") from e


def refuse_shared(path: Path, mode: int, private: str) -> None:
    """A key file, or the directory of keys, that group or others can reach is refused."""
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyPermissionsError(
            f"{path} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
            f"run: chmod {private} {path}"
        )
