"""The ``charter`` command: a thin click layer (parse, call, render)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> Any:
    """Entry point: a recorded help text without click (``_help.py``), else click's
    root group, whose errors become the exit codes of docs/cli.md."""
    from charter.cli._help import answer

    if answer(sys.argv[1:] if argv is None else argv):
        return None
    from charter.cli._main import main as click_main

    return click_main(argv)
