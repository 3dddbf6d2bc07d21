"""Shared CLI plumbing: the context object, output (data on stdout, people on stderr),
and the single place where Charter errors become exit codes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

__all__ = [
    "AsciiIntRange",
    "Ctx",
    "EXIT_ERROR",
    "EXIT_REFUSED",
    "EXIT_TAMPERED",
    "EXIT_USAGE",
    "exit_code_for",
    "run_guarded",
]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TAMPERED = 3
EXIT_REFUSED = 4


class AsciiIntRange(click.IntRange):
    """``click.IntRange`` for ASCII digits only: Python's ``int()`` also reads other
    scripts' digits (``int("٣") == 3``), and a number in a command is a number people
    can read the same way everywhere."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not (
            value.isascii() and value.strip().lstrip("+-").isdigit()
        ):
            self.fail(f"{value!r} is not a whole number written in ASCII digits", param, ctx)
        return super().convert(value, param, ctx)


@dataclass(frozen=True)
class Ctx:
    """Global options, available to every command as ``ctx.obj``."""

    db: str | None
    as_json: bool
    quiet: bool

    def emit(self, data: Any, text: str | Callable[[], None]) -> None:
        """Write the result: JSON on stdout with --json, else the human rendering."""
        if self.as_json:
            click.echo(json.dumps(data, sort_keys=True, default=str))
        elif callable(text):
            text()
        else:
            click.echo(text)

    def status(self, message: str) -> None:
        """A line for people, on stderr; silenced by --quiet or when stderr is no TTY."""
        if not self.quiet:
            click.echo(message, err=True)


def exit_code_for(error: BaseException) -> int | None:
    """The exit code of a Charter error's fault group (docs/cli.md), None for any other
    exception. Imported here, not at the top: ``charter --help`` loads no pydantic."""
    from charter.core.errors import BadInputError, CharterError, RefusedError, TamperedError

    match error:
        case TamperedError():
            return EXIT_TAMPERED
        case RefusedError():
            return EXIT_REFUSED
        case BadInputError():
            return EXIT_USAGE
        case CharterError():
            return EXIT_ERROR
        case _:
            return None


def run_guarded(command: click.Command, argv: list[str] | None) -> Any:
    """Run ``command``; a CharterError becomes one line on stderr and its exit code."""
    try:
        result = command.main(args=argv, standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(EXIT_ERROR)
    except Exception as e:
        code = exit_code_for(e)
        if code is None:  # not one of ours: a bug in Charter, never a traceback for users
            if os.environ.get("CHARTER_DEBUG"):
                raise
            click.echo(
                f"charter: internal error: {type(e).__name__}: {e}. This is a bug in "
                "Charter; please report it with the command you ran (CHARTER_DEBUG=1 "
                "shows the traceback)",
                err=True,
            )
            sys.exit(EXIT_ERROR)
        click.echo(f"charter: error: {e}", err=True)
        sys.exit(code)
    # click returns the code of a ctx.exit(N) / Exit(N) instead of raising it here.
    if isinstance(result, int) and result != 0:
        sys.exit(result)
    return result
