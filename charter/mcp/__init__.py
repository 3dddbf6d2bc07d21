"""``charter mcp``: Charter's tools for any MCP client (docs/mcp.md).

A face above the composition root, like the CLI: the operator's spawn is
``Charter.spawn`` with a durable agent's caller, a worker's goes through its door.
Needs the ``mcp`` extra (``pip install 'charter[mcp]'``); nothing else imports it.
"""

from charter.mcp._faces import (
    IDENTITY_FIELDS,
    MAX_WAIT_S,
    DoorFace,
    Face,
    OperatorFace,
    RevokeParams,
    WaitParams,
)
from charter.mcp._token import (
    TOKEN_FILE,
    file_token_matches,
    issue_token,
    issue_token_file,
    read_token_file,
    require_token,
    token_matches,
    token_path,
)
from charter.mcp.errors import (
    IdentityInArgumentsError,
    McpRefusedError,
    NoIdentityError,
    NotThroughDoorError,
)

__all__ = [
    "IDENTITY_FIELDS",
    "MAX_WAIT_S",
    "TOKEN_FILE",
    "DoorFace",
    "Face",
    "IdentityInArgumentsError",
    "McpRefusedError",
    "NoIdentityError",
    "NotThroughDoorError",
    "OperatorFace",
    "RevokeParams",
    "WaitParams",
    "file_token_matches",
    "issue_token",
    "issue_token_file",
    "read_token_file",
    "require_token",
    "token_matches",
    "token_path",
]
