"""``InvalidModelError``: a public model's bad value, both pydantic's ``ValidationError``
and a :class:`~charter.core.errors.BadInputError`. Apart from ``errors`` because it
imports pydantic_core; ``from charter.core import InvalidModelError`` loads it."""

from __future__ import annotations

from pydantic_core import ValidationError

from charter.core.errors import BadInputError, describe_invalid

__all__ = ["InvalidModelError"]


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


# Its home is the errors module, where every error of the package is looked for
# (``charter.core.errors.InvalidModelError`` loads it on first use); only its code is
# apart, because it imports pydantic_core.
InvalidModelError.__module__ = "charter.core.errors"
