"""The lethal trifecta: a grant that reaches private data, is exposed to untrusted
content and can communicate out is refused when minted (docs/scan.md).

One definition, used by the mint (``decide``) and by ``charter scan``:

* **private data**: the grant names a held secret, or its egress reaches a private
  destination: an address entry (or range) in non-global space (RFC 1918, loopback,
  link-local and cloud metadata, unique-local IPv6, CGNAT, …).
* **untrusted content**: its egress reaches a public destination (a host name, a
  ``*.domain`` pattern, or a global address): whatever comes back from the internet may
  carry instructions. (A definition may also declare an ``untrusted`` input: ``scan``.)
* **a way out**: its egress reaches a public destination outside the **private set**,
  which is the private destinations and the destinations the granted secrets are bound
  to (a credential's own API is where its data lives, not a way out), unless the agent
  declares an untrusted input: then content from anywhere can tell it to write the
  data out through that very API, so every public destination is a way out.

The three together are refused unless the operator's policy names the lineage (or an
ancestor of it) in its allow list. Pure: the bindings of secrets are handed in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from charter.authority.errors import LethalTrifectaError
from charter.core.destination import covers, is_global, split
from charter.core.lineage import Lineage

__all__ = ["Exposure", "TrifectaPolicy", "assess", "check_trifecta", "private_destination"]


Bindings = Callable[[str], tuple[str, ...]]
"""A held secret's name → the destinations it is bound to (none if it is not held)."""


def _no_bindings(_name: str) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class TrifectaPolicy:
    """What the mint checks the trifecta against: where each held secret is bound
    (``bindings``), and the lineages the operator allows it for (``allow``: each names
    itself and its whole subtree)."""

    bindings: Bindings = _no_bindings
    allow: frozenset[str] = field(default_factory=frozenset)

    def allows(self, lineage: Lineage) -> bool:
        return str(lineage) in self.allow or any(str(a) in self.allow for a in lineage.ancestors())


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    pattern, _ = split(entry)
    text = pattern[1:-1] if pattern.startswith("[") else pattern
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError:
        return None  # a name or a pattern


_PRIVATE_NAMES = ("localhost", "local", "internal", "home.arpa")
"""Names that never resolve to the internet: ``localhost`` (loopback, RFC 6761), mDNS's
``.local`` (RFC 6762), ``.internal`` (reserved for private use) and ``home.arpa``
(RFC 8375), each with the names below it."""


def _private_name(entry: str) -> bool:
    pattern, _ = split(entry)
    bare = pattern[2:] if pattern.startswith("*.") else pattern
    return any(bare == n or bare.endswith("." + n) for n in _PRIVATE_NAMES)


def private_destination(entry: str) -> bool:
    """True when the entry reaches non-global addresses (an address entry or range in
    private, loopback, link-local, unique-local, CGNAT or other non-global space) or a
    name that never resolves to the internet (``localhost``, ``*.local``, ``*.internal``,
    ``*.home.arpa``)."""
    net = _network(entry)
    if net is None:
        return _private_name(entry)
    return not is_global(net.network_address) or not is_global(net.broadcast_address)


def public_destination(entry: str) -> bool:
    """True when the entry reaches global addresses: every other name and pattern (the
    broker connects a name only to a global address unless an address entry grants
    another), and every address range not wholly in non-global space (a range wider
    than /8, or /7 for IPv6, is counted public whatever its ends)."""
    net = _network(entry)
    if net is None:
        return not _private_name(entry)
    wide = net.prefixlen < (8 if net.version == 4 else 7)
    return wide or is_global(net.network_address) or is_global(net.broadcast_address)


@dataclass(frozen=True)
class Exposure:
    """Why a grant has each leg of the trifecta (empty: it has not)."""

    private_data: tuple[str, ...]
    untrusted: tuple[str, ...]
    way_out: tuple[str, ...]

    @property
    def lethal(self) -> bool:
        return bool(self.private_data and self.untrusted and self.way_out)

    def describe(self) -> str:
        return (
            f"private data ({', '.join(self.private_data)}), untrusted content "
            f"({', '.join(self.untrusted)}) and a way out ({', '.join(self.way_out)})"
        )


def assess(
    egress: Iterable[str],
    secrets: Iterable[str],
    bindings: Bindings = _no_bindings,
    *,
    untrusted_input: bool = False,
) -> Exposure:
    """The legs of the trifecta a grant of ``egress`` and ``secrets`` holds (see the
    module docstring); ``untrusted_input``: the agent reads untrusted input besides."""
    entries, names = sorted(set(egress)), sorted(set(secrets))
    bound = [b for name in names for b in bindings(name)]
    private = [e for e in entries if private_destination(e)]
    public = [e for e in entries if public_destination(e)]
    out = [e for e in public if untrusted_input or not any(covers(b, e) for b in bound)]
    untrusted = [*public, *(["a declared untrusted input"] if untrusted_input else [])]
    return Exposure(
        private_data=(*(f"secret {n}" for n in names), *(f"private {e}" for e in private)),
        untrusted=tuple(untrusted),
        way_out=tuple(out),
    )


def check_trifecta(
    lineage: Lineage, egress: Iterable[str], secrets: Iterable[str], policy: TrifectaPolicy
) -> None:
    """Raise :class:`LethalTrifectaError` when a grant for ``lineage`` would hold all
    three legs and the policy does not name it."""
    exposure = assess(egress, secrets, policy.bindings)
    if exposure.lethal and not policy.allows(lineage):
        raise LethalTrifectaError(
            f"a grant for {lineage} would combine {exposure.describe()}: the lethal "
            "trifecta. Narrow its egress or secrets, or name the lineage in the "
            "operator's policy (<home>/trifecta.json, docs/scan.md)"
        )
