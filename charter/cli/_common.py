"""Shared CLI plumbing: the context object, output (data on stdout, people on stderr),
and the single place where Charter errors become exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard, TypeVar

import click

from charter.cli._help import EXIT_BROKEN_PIPE, silence_stdout

if TYPE_CHECKING:  # imported when a command runs: `charter --help` loads no pydantic
    from pydantic import BaseModel, ValidationError

    from charter.app import Charter, Journal

__all__ = [
    "AsciiIntRange",
    "Ctx",
    "cell_classes",
    "EXIT_BROKEN_PIPE",
    "EXIT_ERROR",
    "EXIT_REFUSED",
    "EXIT_TAMPERED",
    "EXIT_USAGE",
    "describe_invalid",
    "exit_code_for",
    "host_port",
    "json_option",
    "run_guarded",
    "stdout_closed",
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


class Ctx(NamedTuple):
    """Global options, available to every command as ``ctx.obj`` (a named tuple, not a
    dataclass: ``dataclasses`` would be imported by every help and completion)."""

    db: str | None
    as_json: bool
    quiet: bool

    def emit(self, data: Any, text: str | Callable[[], None]) -> None:
        """Write the result: JSON on stdout with --json, else the human rendering."""
        if self.as_json:
            import json  # not on the path of a help or completion

            click.echo(json.dumps(data, sort_keys=True, default=str))
        elif callable(text):
            text()
        else:
            click.echo(_printable(text))

    def open_charter(self, *, reader: bool = False) -> Charter:
        """The journal at --db (or the home's) with its home, to read and write; a
        ``reader`` (tree, budgets, slots) given a SQLite file this user may not write
        opens it read-only, and folds its projections into a private scratch file."""
        from charter.app import Charter, resolve_location

        self.refuse_missing_journal()
        path = resolve_location(self.db).path
        read_only = reader and path is not None and not _may_write(path)
        return Charter.open(self.db, read_only=read_only)

    def open_journal(self) -> Journal:
        """The journal at --db (or the home's), only to read (verify, show): nothing is
        written, and a file this user may not write is read without side files."""
        from charter.app import read_journal

        self.refuse_missing_journal()
        return read_journal(self.db)

    def refuse_missing_journal(self) -> None:
        """The home's own journal is gone but the home still holds its signing key
        (deleted or moved): one piece of advice for every command, `init` included."""
        if self.db is not None:
            return
        from charter.app import JOURNAL_KEY, resolve_location
        from charter.core import JournalMissingError, KeyStore

        location = resolve_location(None)
        keys = KeyStore()
        if location.path is None or location.path.exists() or not keys.exists(JOURNAL_KEY):
            return
        raise JournalMissingError(
            f"the Charter home {keys.home} holds the signing key of a journal that is "
            f"not at {location.path} (deleted or moved?): put the journal back there, or "
            "point --db at it; to start afresh, move the home aside and run `charter init`"
        )

    def status(self, message: str) -> None:
        """A line for people, on stderr; silenced by --quiet or when stderr is no TTY."""
        if not self.quiet:
            click.echo(_printable(message), err=True)


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


def describe_invalid(error: ValidationError) -> str:
    """:func:`charter.core.errors.describe_invalid` (imported when needed: `charter
    --help` loads no pydantic)."""
    from charter.core.errors import describe_invalid as describe

    return describe(error)


def cell_classes(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...] | str | None
) -> Any:
    """A ``--class NAME`` option's value (one, or a repeated option's tuple), each a
    cell class's name (:func:`charter.control.check_cell_class`); a usage error if not.
    Imported when needed: `charter --help` loads no pydantic."""
    from charter.control.workers import check_cell_class

    try:
        if isinstance(value, tuple):
            return tuple(check_cell_class(v) for v in value)
        return None if value is None else check_cell_class(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


M = TypeVar("M", bound="BaseModel")


def host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) as (host, port); bad input otherwise."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65_535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (like 127.0.0.1:8765)")
    return host, int(port)


def json_option(model: type[M], value: str, what: str) -> M:
    """A ``JSON|@FILE`` option's value as ``model``: the JSON itself, or the file after
    ``@``; unreadable or invalid, a usage error naming ``what`` was expected."""
    from pydantic import ValidationError

    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise click.BadParameter(f"cannot read {value[1:]}: {e}") from e
    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        raise click.BadParameter(f"not {what}: {describe_invalid(e)}") from e


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
        if _is_validation_error(e):  # a value no command checked first: bad input
            click.echo(f"charter: error: invalid input: {describe_invalid(e)}", err=True)
            sys.exit(EXIT_USAGE)
        code = exit_code_for(e)
        if code is None and isinstance(e, OSError) and e.filename is not None:
            # The host said no (permissions, a missing or full disk): not a bug.
            click.echo(f"charter: error: {e.strerror}: {e.filename}", err=True)
            sys.exit(EXIT_ERROR)
        if code is None:  # not one of ours: a bug in Charter, never a traceback for users
            if os.environ.get("CHARTER_DEBUG"):
                raise
            click.echo(
                f"charter: internal error: {type(e).__name__}: {_printable(str(e))}. This "
                "is a bug in Charter; please report it with the command you ran "
                "(CHARTER_DEBUG=1 shows the traceback)",
                err=True,
            )
            sys.exit(EXIT_ERROR)
        click.echo(f"charter: error: {_printable(str(e))}", err=True)
        sys.exit(code)
    # click returns the code of a ctx.exit(N) / Exit(N) instead of raising it here.
    if isinstance(result, int) and result != 0:
        sys.exit(result)
    return result


def _printable(text: str) -> str:
    """Text for people with its control characters escaped, its lines kept: a message
    may quote what a worker or the journal holds (:func:`charter.cli._render.printable`)."""
    from charter.cli._render import printable

    return printable(text, lines=True)


def _may_write(path: Path) -> bool:
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _is_validation_error(error: Exception) -> TypeGuard[ValidationError]:
    # pydantic's ValidationError is pydantic_core's: if that was never imported, no
    # model raised one (and a light command's error loads no pydantic to find that out)
    core = sys.modules.get("pydantic_core")
    return core is not None and isinstance(error, core.ValidationError)


def stdout_closed() -> click.exceptions.Exit:
    """The reader of stdout went away (``charter journal show | head -1``): stop
    quietly with 141 (128 + SIGPIPE), what a shell reports for a command ended by the
    closed pipe. stdout is pointed at /dev/null first, so that the interpreter's own
    flush at exit does not complain on stderr."""
    silence_stdout()
    return click.exceptions.Exit(EXIT_BROKEN_PIPE)
