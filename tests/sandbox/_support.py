"""Helpers: run Python or a shell inside a real sandbox, and the same program on the host."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from charter.core import Budget
from charter.sandbox import Launcher, Outcome

PY = "/usr/bin/python3"  # Debian's, visible inside through the read-only /usr


def sandboxed(launcher: Launcher, budget: Budget, code: str, *args: str, **kw: Any) -> Outcome:
    return launcher.run(
        budget, [PY, "-I", "-c", code, *args], capture=True, stdin=subprocess.DEVNULL, **kw
    )


def on_host(
    code: str, *args: str, user: int | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The same program outside any sandbox: the positive control."""
    return subprocess.run(
        [PY, "-I", "-c", code, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
        cwd=cwd,
    )


def out(outcome: Outcome) -> str:
    return (outcome.stdout or b"").decode()
