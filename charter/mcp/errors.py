"""Refusals of the MCP server (each with its stable reason code, docs/mcp.md)."""

from __future__ import annotations

from typing import ClassVar

from charter.core import RefusedError

__all__ = ["IdentityInArgumentsError", "McpRefusedError", "NoIdentityError", "NotThroughDoorError"]


class McpRefusedError(RefusedError, abstract=True):
    """A tool call the MCP server refuses before it reaches Charter's services."""

    reason: ClassVar[str] = "mcp"


class NoIdentityError(McpRefusedError):
    """The client presented no identity this server accepts (no or a wrong token)."""

    reason = "no-identity"


class IdentityInArgumentsError(McpRefusedError):
    """The arguments name who is asking (a parent, lineage, cell, ...): identity comes
    from the connection, never from the arguments."""

    reason = "identity-in-arguments"


class NotThroughDoorError(McpRefusedError):
    """A tool a worker's door does not answer (a worker has no projection reads)."""

    reason = "not-through-door"
