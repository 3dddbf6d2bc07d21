"""Text from outside (a worker's lineage, a policy's message) as it may appear inside an
error message or a journaled reason: one line, every control or invisible character
escaped, so what a worker writes can never forge a second line in a log or a terminal."""

from __future__ import annotations

__all__ = ["shown"]


def shown(text: object, limit: int = 500) -> str:
    """``text`` with every non-printable character escaped the way ``repr`` does
    (``\\n``, ``\\x1b``, ``\\u2028`` …), a backslash doubled (so an escape written
    by the worker cannot pass for one made here), without quotes, cut to ``limit``
    characters (an ellipsis says so). Printable text, in any script, is left as it is."""
    raw = str(text)
    if raw.isprintable() and "\\" not in raw and len(raw) <= limit:
        return raw  # the common case: nothing to escape
    escaped = "".join(c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in raw)
    return escaped if len(escaped) <= limit else escaped[: limit - 1] + "…"
