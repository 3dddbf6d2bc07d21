"""The ``charter`` command: a thin click layer (parse, call, render)."""

from charter.cli._main import main

__all__ = ["main"]
