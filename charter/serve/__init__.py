"""``charter serve``: the operator's read-only page of the fabric (docs/serve.md).

A face above the composition root, like ``charter mcp``: it opens the journal
read-only through :mod:`charter.app` and answers from the projections (tree, budgets,
slots as of any position) and the journal's refusals and verdicts. starlette and
uvicorn come with the ``serve`` extra; nothing below this package imports them.
"""

from charter.serve._app import COOKIE, LOOPBACK_HOSTS, build_app, session_value
from charter.serve._fabric import NOTABLE, Fabric
from charter.serve.server import SERVE_TOKEN_FILE, is_loopback, serve

__all__ = [
    "COOKIE",
    "LOOPBACK_HOSTS",
    "NOTABLE",
    "SERVE_TOKEN_FILE",
    "Fabric",
    "build_app",
    "is_loopback",
    "serve",
    "session_value",
]
