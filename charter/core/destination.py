"""Egress destinations: the one vocabulary the grant's egress axis and the egress broker
both speak.

An entry is a host pattern and an optional port:

| entry                   | admits                                            |
|-------------------------|---------------------------------------------------|
| ``api.example.com``     | that host, on ports 80 and 443                    |
| ``*.example.com``       | every host strictly below example.com, 80 and 443 |
| ``api.example.com:8443``| that host, on port 8443 only                      |
| ``*.example.com:8443``  | every host below example.com, on port 8443 only   |

Host labels are lower-case DNS labels; a ``*`` is allowed only as the whole first label.
Schemes, paths, a bare ``*`` and upper case are refused, so every entry has one meaning.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from charter.core.errors import AxisValueError

__all__ = ["DEFAULT_PORTS", "Destination", "admits", "check_destination", "covers", "split"]

DEFAULT_PORTS = frozenset({80, 443})
"""The ports an entry without a port admits (HTTP and HTTPS)."""

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_MAX_HOST = 253
_PORT = re.compile(r"[1-9][0-9]{0,4}")


def split(entry: str) -> tuple[str, frozenset[int] | None]:
    """An entry as (host pattern, its port set, or None for the default ports)."""
    host, sep, port = entry.rpartition(":")
    if not sep:
        return entry, None
    return host, frozenset({int(port)})


def check_destination(entry: str) -> str:
    """Validate an entry (see the module table); return it unchanged."""
    host, sep, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
    bare = host[2:] if host.startswith("*.") else host
    labels = bare.split(".")
    port_ok = not sep or (_PORT.fullmatch(port) is not None and int(port) <= 65535)
    if (
        not bare
        or len(bare) > _MAX_HOST
        or not all(_LABEL.fullmatch(x) for x in labels)
        or not port_ok
    ):
        raise AxisValueError(
            f"egress destination {entry[:80]!r}: write an exact host (api.example.com) or "
            "a pattern for its subdomains (*.example.com), optionally with a port "
            "(api.example.com:8443): lower-case letters, digits and '-' in dot-separated "
            "labels; no scheme, path or bare '*'"
        )
    return entry


def _after(value: str) -> str:
    try:
        return check_destination(value)
    except AxisValueError as e:
        raise ValueError(str(e)) from e


Destination = Annotated[str, AfterValidator(_after)]


def _host_covers(wider: str, narrower: str) -> bool:
    # An exact host admits itself; "*.d" admits every host strictly below d (not d
    # itself), at any depth, so it covers "*.d", "x.d" and "*.x.d".
    if wider.startswith("*."):
        suffix = wider[1:]  # ".d"
        inner = narrower[2:] if narrower.startswith("*.") else narrower
        return narrower == wider or inner.endswith(suffix)
    return narrower == wider


def covers(wider: str, narrower: str) -> bool:
    """True when every (host, port) that ``narrower`` admits is admitted by ``wider``."""
    w_host, w_ports = split(wider)
    n_host, n_ports = split(narrower)
    ports_ok = (n_ports or DEFAULT_PORTS) <= (w_ports or DEFAULT_PORTS)
    return ports_ok and _host_covers(w_host, n_host)


def admits(entry: str, host: str, port: int) -> bool:
    """True when ``entry`` lets a connection to ``host:port`` through.

    ``host`` is normalised (lower case, no trailing dot) before it is compared.
    """
    pattern, ports = split(entry)
    if port not in (ports or DEFAULT_PORTS):
        return False
    name = host.lower().rstrip(".")
    if pattern.startswith("*."):
        return name.endswith(pattern[1:]) and len(name) > len(pattern) - 1
    return name == pattern
