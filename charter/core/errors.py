"""The one error base and its fault groups. Every package's ``errors`` module derives
its errors from these; the CLI maps each group to an exit code once (see docs/cli.md).

| group             | exit | meaning                                                      |
|-------------------|------|--------------------------------------------------------------|
| BadInputError     | 2    | the caller gave something malformed                          |
| StateError        | 1    | the request does not fit the current state                   |
| UnavailableError  | 1    | a backend (database, host facility) could not be used        |
| TamperedError     | 3    | stored history does not verify                               |
| RefusedError      | 4    | refused by policy; ``reason`` is the stable journaled code   |
| InternalError     | 1    | a bug in Charter: the message asks the user to report it     |
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    # InvalidModelError (at the end) is also pydantic's ValidationError; it is made on
    # first use, so the users of these pure errors load no pydantic.
    from pydantic_core import ValidationError

__all__ = [
    "describe_invalid",
    "CharterError",
    "BadInputError",
    "UnavailableError",
    "StateError",
    "TamperedError",
    "RefusedError",
    "InternalError",
    # bad input in the shared vocabulary
    "AxisValueError",
    "BudgetSyntaxError",
    "LineageError",
    # state of the home and the journal's types
    "HomeUnusableError",
    "JournalMissingError",
    "KeyNotFoundError",
    "KeyPermissionsError",
    "UnknownEventTypeError",
    # held secrets
    "SecretNotFoundError",
    "SecretExistsError",
    "SecretSourceError",
    "SecretSealBrokenError",
]


class CharterError(Exception):
    """Base of every error Charter raises on purpose; the message says what to do."""


class BadInputError(CharterError):
    """The caller gave something malformed (exit 2)."""


class UnavailableError(CharterError):
    """A backend (database, host facility) could not be reached or used (exit 1)."""


class StateError(CharterError):
    """The request does not fit the current state: already initialised, not a journal …"""


class TamperedError(CharterError):
    """Stored history does not verify (exit 3)."""


class InternalError(CharterError):
    """A broken promise inside Charter itself, never the caller's fault (exit 1)."""

    def __init__(self, message: str) -> None:
        super().__init__(
            f"internal error: {message}. This is a bug in Charter; please report it with "
            "the command you ran"
        )


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class RefusedError(CharterError):
    """Refused by policy: gate, invariant, admission, budget, or an unisolating host (exit 4).

    ``reason`` is a stable code: what the journal records with the refusal. Every
    concrete refusal class declares its own (checked when the class is defined), so no
    two kinds of refusal are journaled under one code.
    """

    reason: ClassVar[str] = "refused"
    _reasons: ClassVar[dict[str, type[RefusedError]]] = {}

    _abstract: ClassVar[bool] = True

    def __init_subclass__(cls, *, abstract: bool = False, **kwargs: Any) -> None:
        """``abstract=True`` marks a group of refusals (never raised itself)."""
        super().__init_subclass__(**kwargs)
        cls._abstract = abstract
        if abstract:
            return
        reason = cls.__dict__.get("reason")
        if not isinstance(reason, str) or not reason or reason == "refused":
            raise TypeError(
                f"refusal class {cls.__qualname__} must declare its own stable `reason` code"
            )
        other = RefusedError._reasons.get(reason)
        if other is not None and _name(other) != _name(cls):
            raise TypeError(
                f"refusal classes {other.__qualname__} and {cls.__qualname__} share the "
                f"reason code {reason!r}"
            )
        RefusedError._reasons[reason] = cls

    def __init__(self, *args: object) -> None:
        if type(self)._abstract:
            raise TypeError(f"{type(self).__qualname__} is a group of refusals; raise a member")
        super().__init__(*args)


class LineageError(BadInputError):
    """A lineage path is malformed, empty, overlong, or has characters it may not have."""


class AxisValueError(BadInputError):
    """A grant axis value (tool, destination, secret, level, …) is not valid."""


class BudgetSyntaxError(BadInputError):
    """A budget vector string could not be parsed."""


class HomeUnusableError(StateError):
    """The Charter home is not a directory, or this user may not read or write it."""


class JournalMissingError(StateError):
    """The home holds the signing key of a journal that is no longer where the home
    keeps it (deleted or moved): neither a read nor a new ``init`` can go on."""


class KeyNotFoundError(StateError):
    """No key of that name in the Charter home."""


class KeyPermissionsError(StateError):
    """A key file or the keys directory is readable by others; refuse to use it."""


class SecretNotFoundError(StateError):
    """No held secret of that name in the Charter home."""


class SecretExistsError(StateError):
    """A held secret of that name exists already; remove it first to replace it."""


class SecretSourceError(BadInputError):
    """A secret's source cannot be used: a file that cannot be read, an unset or empty
    environment variable, a certificate file without its key, or a value with bytes a
    header cannot carry."""


class SecretSealBrokenError(TamperedError):
    """A sealed secret does not open with the home's secrets key (changed on disk, moved
    from another name, or sealed under another key)."""


class UnknownEventTypeError(StateError):
    """A stored entry names an event type this version of Charter does not know."""


def describe_invalid(error: ValidationError) -> str:
    """A pydantic error as one line for people: each field and what is wrong with it,
    without pydantic's type codes, inputs and web links (the one translation, used
    wherever a model's refusal becomes a BadInputError or a CLI message)."""
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"]) or error.title
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


# -- InvalidModelError: built on first use ---------------------------------------------
# It is both pydantic's ValidationError and a BadInputError, so its class needs
# pydantic_core, which the users of the pure errors above never load: the class is made
# here, in the errors module, when first asked for (module ``__getattr__``), once.

if TYPE_CHECKING:

    class InvalidModelError(ValidationError, BadInputError):
        """See :func:`_build_invalid_model_error`."""

        @classmethod
        def of(cls, error: ValidationError, title: str) -> BadInputError: ...


_building = threading.Lock()


def _build_invalid_model_error() -> type[BadInputError]:
    from pydantic_core import ValidationError

    class InvalidModelError(ValidationError, BadInputError):
        """A public model (``Budget``, ``Ceiling``, ``CellSetup``, ``WorkerSpec``, …) was
        built from bad values. Its message is :func:`describe_invalid`'s one line (each
        field and what is wrong with it), without pydantic's type codes and links; it is
        also pydantic's ``ValidationError``, so ``.errors()`` and code that catches
        pydantic's error keep working."""

        def __str__(self) -> str:
            # A check of the whole model has no field: its message says which.
            text = describe_invalid(self).removeprefix(f"{self.title}: ")
            return f"invalid {self.title}: {text}"

        @classmethod
        def of(cls, error: ValidationError, title: str) -> BadInputError:
            """``error`` (from building ``title``) as a CharterError: a plain
            BadInputError with the same message for an error pydantic cannot rebuild."""
            try:
                rebuilt: BadInputError = cls.from_exception_data(
                    title,
                    error.errors(include_url=False),  # type: ignore[arg-type]
                )
            except (TypeError, ValueError, KeyError):
                return BadInputError(f"invalid {title}: {describe_invalid(error)}")
            return rebuilt

    InvalidModelError.__qualname__ = "InvalidModelError"
    return InvalidModelError


def __getattr__(name: str) -> object:
    """``InvalidModelError``, made on first use and kept (later lookups are plain
    attribute reads)."""
    if name != "InvalidModelError":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _building:  # one class, however many threads ask at once
        made = globals().get(name)
        if made is None:
            made = globals()[name] = _build_invalid_model_error()
    return made
