"""The operator's MCP token: what an HTTP client outside a sandbox presents to act as
the operator (``Authorization: Bearer TOKEN``).

``charter mcp token`` writes 32 random bytes (hex) to ``<home>/mcp-token``, created
0600 in the home (itself 0700), replacing any earlier token at once (a rename: a
server that checks a request after it reads the new one). The server reads the file
for every check, so a rotated token is refused from the next request on, and a
removed file refuses every request. A token that is not the file's exact content is
refused by a constant-time comparison; so is every token when the file is missing,
empty, or readable by anyone but its owner (another user could have read it).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from charter.core import StateError

__all__ = [
    # the operator's MCP token in the home
    "TOKEN_FILE", "token_path", "issue_token", "token_matches", "require_token",
    # any token file (`charter serve` has its own)
    "issue_token_file", "read_token_file", "file_token_matches",
]  # fmt: skip

TOKEN_FILE = "mcp-token"  # noqa: S105 (a file name, not a secret)
_TOKEN_BYTES = 32


def token_path(home: Path) -> Path:
    return home / TOKEN_FILE


def issue_token(home: Path) -> str:
    """A new operator token, written 0600 into ``home`` (replacing the old one)."""
    return issue_token_file(token_path(home))


def issue_token_file(target: Path) -> str:
    """A new token, written 0600 at ``target`` (its directory made 0700 if missing),
    replacing the old one at once. ``charter serve token`` shares it (docs/serve.md)."""
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_hex(_TOKEN_BYTES)
    scratch = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(scratch, target)
    except BaseException:
        with contextlib.suppress(OSError):
            scratch.unlink()
        raise
    return token


def read_token_file(path: Path) -> str | None:
    """The token at ``path``: None when there is none, or it is not private to its owner."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.geteuid():
            return None
        text = f.read(4 * _TOKEN_BYTES).strip()
    return text or None


def token_matches(home: Path, presented: str) -> bool:
    """Whether ``presented`` is the operator token of ``home`` (constant time)."""
    return file_token_matches(token_path(home), presented)


def file_token_matches(path: Path, presented: str) -> bool:
    """Whether ``presented`` is the token at ``path`` (constant time)."""
    current = read_token_file(path)
    if current is None or not presented:
        return False
    return hmac.compare_digest(current.encode(), presented.encode())


def require_token(home: Path) -> None:
    """Refuse to serve HTTP without a usable token: every request would be refused."""
    if read_token_file(token_path(home)) is None:
        raise StateError(
            f"no usable operator token in {token_path(home)} (missing, empty, or readable by "
            "others): run `charter mcp token` first"
        )
