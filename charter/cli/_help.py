"""``charter … --help`` answered without importing click.

click's import alone costs about as much as an interpreter's start, so a help text that
click would print for a terminal of 80 columns or more (or no terminal at all) is
recorded, rendered by click from the real commands, in ``_helps.py`` (``scripts/cli-index``
writes it beside ``_index.py``), and :func:`answer` prints it when the arguments are
exactly a command's path and one of its help options. Anything else (a narrower
terminal, a global option, ``python -m charter``'s program name, sources the record was
not made from) goes to click, which prints the same text the slower way.
``tests/cli/test_startup.py`` checks that every recorded text is click's.

This module imports nothing that click's path does not: it is on every ``charter`` run.
"""

from __future__ import annotations

import os
import pathlib
import sys

__all__ = ["EXIT_BROKEN_PIPE", "GENERATED", "WIDTH", "answer", "silence_stdout", "sources_digest"]

GENERATED = ("_index.py", "_helps.py")  # written by scripts/cli-index, not its input
WIDTH = 80  # the columns a recorded text is for: click wraps at min(columns, 80) - 2


def sources_digest() -> str:
    """A CRC-32 of the CLI's own sources (the generated files aside) and their lengths:
    the index and the recorded help texts name the one they were generated from, and
    are not used by sources that differ (a merge that changed a command without
    regenerating them costs a slower help, never a wrong one). A staleness check
    against accidents, not an adversary, run on every help and completion: zlib, not
    hashlib, whose import (OpenSSL's start-up) costs about 4 ms here."""
    import zlib

    crc, size = 0, 0
    for path in sorted(pathlib.Path(__file__).parent.glob("*.py")):
        if path.name not in GENERATED:
            data = path.name.encode() + b"\0" + path.read_bytes() + b"\0"
            crc, size = zlib.crc32(data, crc), size + len(data)
    return f"crc32:{crc:08x}:{size}"


def _columns() -> int:
    """The columns click would wrap for (``shutil.get_terminal_size``'s rule)."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return WIDTH


def _named_charter() -> bool:
    """Whether click would call the program ``charter`` (an installed entry point, not
    ``python -m charter``)."""
    main = sys.modules.get("__main__")
    return getattr(main, "__package__", None) in {None, ""} and (
        os.path.basename(sys.argv[0]) == "charter"
    )


def answer(args: list[str]) -> bool:
    """Print the recorded help ``args`` ask for and return True, or return False (the
    caller runs click) when there is none or it might not be click's text."""
    if not args or args[-1] not in ("--help", "-h") or "_CHARTER_COMPLETE" in os.environ:
        return False
    from charter.cli._helps import HELPS, SOURCES

    recorded = HELPS.get(" ".join(args[:-1]))
    if recorded is None or args[-1] not in recorded[0]:
        return False
    if _columns() < WIDTH or not _named_charter() or sources_digest() != SOURCES:
        return False
    try:
        sys.stdout.write(recorded[1] + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        sys.exit(EXIT_BROKEN_PIPE)
    return True


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command the pipe ended


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's own flush at exit does not
    complain on stderr after the reader of stdout went away."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
