"""Running the real ``charter`` command in a subprocess, as root or as another user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Run as another user: the interpreter lives under a directory only root may enter, so
# the child imports every module the command may need first, then drops to the user.
_AS_USER = """
import importlib, os, pkgutil, sys
sys.path.insert(0, {root!r})
import charter, click, rich
import difflib, textwrap  # what click and rich import lazily
for package in (charter, click, rich):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
        except Exception:  # another platform's module (click._winconsole)
            pass
os.setgroups([]); os.setgid({uid}); os.setuid({uid})
from charter.cli import main
main(sys.argv[1:])
"""


def _env(home: Path | None, env: dict[str, str] | None) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CHARTER_DB", "CHARTER_DEBUG", "CHARTER_HOME", "XDG_DATA_HOME")
    }
    if home is not None:
        base["CHARTER_HOME"] = str(home)
    return {**base, "PYTHONPATH": str(ROOT), **(env or {})}


def charter(
    *args: str,
    home: Path | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    uid: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """``charter ARGS`` in a real process; ``uid``: as that (unprivileged) user."""
    if uid is None:
        argv = [sys.executable, "-m", "charter", *args]
    else:
        argv = [sys.executable, "-c", _AS_USER.format(root=str(ROOT), uid=uid), *args]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=cwd or (home.parent if home else ROOT),
        env=_env(home, env),
        timeout=120,
        check=False,
    )
