"""Placeholder: the `agents` commands are registered here by their issue's work."""

from __future__ import annotations

import click

__all__ = ["register"]


def register(group: click.Group) -> None:
    """Add this module's commands to the root group (none yet)."""
    del group
