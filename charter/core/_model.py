"""The base of Charter's public models: a bad value raises a CharterError."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import BaseModel, ValidationError

from charter.core.errors import InvalidModelError

__all__ = ["CheckedModel"]


class CheckedModel(BaseModel):
    """A model a caller builds (the Python API's types, the CLI's options): building,
    or validating, one with a bad value raises :class:`InvalidModelError` (a
    BadInputError naming each field and what is wrong with it), never a bare pydantic
    error with its web links. Nested validation (a model inside another) is pydantic's
    own, and the JSON Schema is unchanged."""

    invalid_error: ClassVar[type[InvalidModelError]] = InvalidModelError

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise self.invalid_error.of(e, type(self).__name__) from None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as e:
            raise cls.invalid_error.of(e, cls.__name__) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, **kwargs)
        except ValidationError as e:
            raise cls.invalid_error.of(e, cls.__name__) from None
