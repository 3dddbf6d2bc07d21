"""Names a package loads when first asked for: ``__getattr__ = lazy_names(__name__,
{name: module})`` in its ``__init__`` (PEP 562), with the same names imported under
``TYPE_CHECKING`` for the type checker. Importing the package then costs nothing of
what its names' modules import (charter.core's models import pydantic, the ledger's
journal eventsourcing), and ``from package import Name`` works as always."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``where[name]``'s module is imported on
    the first access of ``name``, and the value kept in the package (later lookups are
    plain attribute reads)."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - a module's __getattr__
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
