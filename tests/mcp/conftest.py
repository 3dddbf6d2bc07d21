"""Fixtures for the MCP server's tests: a real journal (both backends), a home, and the
cell tests' real bwrap sandboxes (their fixtures, imported)."""

from __future__ import annotations

from tests.runner.conftest import _no_load, state_dir

__all__ = ["_no_load", "state_dir"]
