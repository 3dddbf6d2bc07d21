"""Held credentials at the egress broker: which secrets a dial gets, the TLS the broker
originates to present them, and the request head it rewrites to carry them.

A sandbox never holds a credential. For a destination a held secret is bound to, the
worker speaks *plain HTTP* to the broker over its unix socket (``http://host:port/…``,
the request never leaves the host that way) and the broker originates TLS to the
destination itself, verifying the destination's certificate for the host dialed
(the system's trust store, or the secret's own CA bundle), presenting a held client
certificate in that handshake, and adding the held headers to the request. The worker
never sees the TLS session, the certificate's key, or the header values; nothing
Charter-signed is given to the worker to trust (no interception CA).

One request per connection: the head sent upstream says ``Connection: close``, so every
request is a new dial, checked, journaled and injected on its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path

import h11

from charter.core.errors import InternalError
from charter.core.identity import IdentityKey, audience
from charter.core.secrets import HeldSecret, SecretStore

__all__ = ["Conflict", "Credentials", "rewrite_head"]

# Headers of the worker's request that never go upstream from an injected dial: hop-by-hop
# ones (the broker's own Connection: close replaces them) and the proxy's.
_HOP = frozenset({b"connection", b"keep-alive", b"upgrade", b"te", b"trailer", b"proxy-connection"})


class Conflict(Exception):  # noqa: N818 (the broker answers it; it never escapes)
    """Two held secrets bound to one dial that cannot both be presented."""


class Credentials:
    """The held secrets one egress broker may present, opened once, and the identity
    key it mints tokens with. Which of them a dial gets is decided per registered
    sandbox: only secrets its grant names, only for a destination each is bound to."""

    def __init__(
        self, secrets: Mapping[str, HeldSecret], identity: IdentityKey | None = None
    ) -> None:
        if any(s.kind == "identity" for s in secrets.values()) and identity is None:
            raise InternalError("an identity secret needs the home's identity key")
        self._secrets = dict(secrets)
        self._identity = identity
        self._contexts: dict[tuple[str, bytes], ssl.SSLContext] = {}

    @classmethod
    def from_home(cls, home: Path, names: Iterable[str] | None = None) -> Credentials:
        """The held secrets of ``home`` (every one, or ``names``, each of which must be
        held), with the identity key when one of them needs it."""
        store = SecretStore(home)
        held = store.load_many(store.names() if names is None else names)
        needs_key = any(s.kind == "identity" for s in held.values())
        return cls(held, IdentityKey.load_or_create(home) if needs_key else None)

    def names(self) -> frozenset[str]:
        return frozenset(self._secrets)

    def bound(self, granted: Iterable[str], host: str, port: int) -> tuple[HeldSecret, ...]:
        """The secrets of ``granted`` (a grant's secret names) bound to ``host:port``."""
        held = (self._secrets.get(name) for name in sorted(set(granted)))
        return tuple(s for s in held if s is not None and s.binds(host, port))

    def context(self, chosen: tuple[HeldSecret, ...]) -> ssl.SSLContext:
        """The client TLS context for a dial presenting ``chosen``: hostname checked, the
        secrets' CA (or the system store), and the held client certificate if any."""
        certs = [s for s in chosen if s.kind == "client-cert"]
        cas = {s.ca for s in chosen if s.ca}
        if len(certs) > 1 or len(cas) > 1:
            raise Conflict("more than one client certificate or CA bound to this destination")
        cert = certs[0] if certs else None
        ca = next(iter(cas), b"")
        key = (cert.name if cert is not None else "", hashlib.sha256(ca).digest())
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = ssl.create_default_context(cadata=ca.decode("ascii") if ca else None)
            if cert is not None:
                _load_cert_chain(ctx, cert)
            self._contexts[key] = ctx
        return ctx

    def headers(
        self, chosen: tuple[HeldSecret, ...], host: str, port: int, subject: str, now_s: int
    ) -> list[tuple[bytes, bytes]]:
        """The headers the dial carries, minted now for an identity secret."""
        out: list[tuple[bytes, bytes]] = []
        for s in chosen:
            if s.kind == "bearer":
                out.append((b"authorization", b"Bearer " + s.value))
            elif s.kind == "header":
                out.append((s.header.lower().encode("ascii"), s.value))
            elif s.kind == "identity" and self._identity is not None:
                token = self._identity.mint(
                    issuer=s.issuer or "charter", subject=f"{subject}/{s.name}",
                    aud=audience(host, port), ttl_s=s.ttl_s, now_s=now_s,
                )  # fmt: skip
                out.append((b"authorization", b"Bearer " + token.encode("ascii")))
        names = [k for k, _ in out]
        if len(names) != len(set(names)):
            raise Conflict("two held secrets bound to this destination set the same header")
        return out

    def prepare(
        self, chosen: tuple[HeldSecret, ...], forward: bytes, host: str, port: int, *,
        subject: str, now_s: int,
    ) -> tuple[ssl.SSLContext, bytes] | None:  # fmt: skip
        """The TLS context and the request (``forward`` with the held headers in) of a
        dial of ``host:port`` presenting ``chosen``; None when ``forward`` is not one
        HTTP request. Raises :class:`Conflict` for secrets that cannot go together."""
        context = self.context(chosen)
        forward_with = rewrite_head(forward, self.headers(chosen, host, port, subject, now_s))
        return None if forward_with is None else (context, forward_with)


def _load_cert_chain(ctx: ssl.SSLContext, cert: HeldSecret) -> None:
    """Load a held client certificate without writing its key to a file: ``ssl`` takes
    only paths, so the PEM goes into an anonymous memfd, read by its /proc path."""
    fd = os.memfd_create("charter-client-cert", os.MFD_CLOEXEC)
    try:
        os.write(fd, cert.value + b"\n" + cert.key)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)


def rewrite_head(forward: bytes, inject: list[tuple[bytes, bytes]]) -> bytes | None:
    """The request in ``forward`` (its head, then whatever followed it) with every
    header named in ``inject`` replaced by the held value, hop-by-hop headers dropped
    and ``Connection: close`` added; None when it is not one HTTP request."""
    parser = h11.Connection(h11.SERVER)
    parser.receive_data(forward)
    try:
        event = parser.next_event()
    except h11.RemoteProtocolError:
        return None
    if not isinstance(event, h11.Request):
        return None
    rest = bytes(parser.trailing_data[0])
    replaced = {k for k, _ in inject}
    version = event.http_version.decode("ascii")
    lines = [event.method + b" " + event.target + f" HTTP/{version}".encode("ascii")]
    for raw_name, value in event.headers.raw_items():
        name = raw_name.lower()
        if name in replaced or name in _HOP or name.startswith(b"proxy-"):
            continue
        lines.append(raw_name + b": " + value)
    lines += [k + b": " + v for k, v in inject]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + rest
