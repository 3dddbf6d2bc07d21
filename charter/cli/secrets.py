"""``charter secret add|list|remove`` and ``charter keys publish``: the held secrets of
the Charter home and the public half of its identity key. No command prints a value."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from charter.cli._common import AsciiIntRange, Ctx
from charter.core.clock import now_ms
from charter.core.errors import SecretSourceError
from charter.core.home import charter_home
from charter.core.identity import IdentityKey
from charter.core.secrets import (
    SECRET_KINDS,
    HeldSecret,
    SecretKind,
    SecretStore,
    client_cert_from_pem,
)

__all__ = ["keys_group", "secret_group"]


@click.group("secret")
def secret_group() -> None:
    """Credentials Charter holds for workers: sealed in the home, presented by the egress
    broker, never inside a sandbox."""


def _read_source(from_file: Path | None, from_env: str | None) -> bytes:
    if (from_file is None) == (from_env is None):
        raise click.UsageError("give exactly one of --from-file F or --from-env VAR")
    if from_file is not None:
        try:
            data = from_file.read_bytes()
        except OSError as e:
            raise SecretSourceError(f"cannot read {from_file}: {e.strerror or e}") from e
    else:
        data = os.environb.get(os.fsencode(from_env or ""), b"")
        if not data:
            raise SecretSourceError(f"the environment variable {from_env} is unset or empty")
    return data


@secret_group.command("add")
@click.argument("name")
@click.option("--kind", type=click.Choice(SECRET_KINDS), default="bearer", show_default=True,
              help="bearer: Authorization: Bearer VALUE; header: --header NAME: VALUE; "
                   "client-cert: a PEM file of the chain and its key, for mutual TLS; "
                   "identity: an ES256 token minted per connection (no value).")  # fmt: skip
@click.option("--from-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Read the value from this file (one trailing newline dropped).")  # fmt: skip
@click.option("--from-env", metavar="VAR", default=None,
              help="Read the value from this variable of your environment.")  # fmt: skip
@click.option("--for", "bound_to", multiple=True, required=True, metavar="DESTINATION",
              help="A destination it is presented to (repeat): host, *.domain, :port.")  # fmt: skip
@click.option("--header", default="", metavar="NAME", help="The header of a 'header' secret.")
@click.option("--ca-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None,
              help="Trust this CA (PEM) for the destinations, not the system's.")  # fmt: skip
@click.option("--issuer", default="charter", show_default=True,
              help="The 'iss' of an identity secret's tokens.")  # fmt: skip
@click.option("--ttl", type=AsciiIntRange(1, 3600), default=300, show_default=True,
              metavar="SECONDS", help="How long an identity token lives.")  # fmt: skip
@click.pass_obj
def add(
    ctx: Ctx, name: str, kind: SecretKind, from_file: Path | None, from_env: str | None,
    bound_to: tuple[str, ...], header: str, ca_file: Path | None, issuer: str, ttl: int,
) -> None:  # fmt: skip
    """Seal secret NAME in the home, bound to the --for destinations. A grant that
    names NAME lets the egress broker present it there; the value is never printed."""
    home = charter_home()
    value, key = b"", b""
    if kind == "identity":
        if from_file is not None or from_env is not None:
            raise click.UsageError("an identity secret has no value: Charter mints its tokens")
        IdentityKey.load_or_create(home)
    else:
        value = _read_source(from_file, from_env)
        if kind == "client-cert":
            value, key = client_cert_from_pem(value)
        else:
            value = value.removesuffix(b"\n").removesuffix(b"\r")
    ca = ca_file.read_bytes() if ca_file is not None else b""
    secret = HeldSecret(
        name, kind, tuple(bound_to), value=value, key=key, header=header, ca=ca,
        issuer=issuer if kind == "identity" else "", ttl_s=ttl,
        created_ms=now_ms(),
    )  # fmt: skip
    SecretStore(home).add(secret)
    ctx.emit(secret.described(), f"sealed {name} ({kind}) for {', '.join(bound_to)}")


@secret_group.command("list")
@click.pass_obj
def list_cmd(ctx: Ctx) -> None:
    """The held secrets: name, kind, destinations (never a value)."""
    store = SecretStore(charter_home())
    shown = [s.described() for s in store.load_many(store.names()).values()]

    def text() -> None:
        for s in shown:
            click.echo(f"{s['name']}\t{s['kind']}\t{','.join(s['for'])}")  # type: ignore[arg-type]

    ctx.emit(shown, text)


@secret_group.command("remove")
@click.argument("name")
@click.pass_obj
def remove(ctx: Ctx, name: str) -> None:
    """Delete secret NAME from the home."""
    SecretStore(charter_home()).remove(name)
    ctx.emit({"removed": name}, f"removed {name}")


@click.group("keys")
def keys_group() -> None:
    """Charter's public keys, for verifiers outside it."""


@keys_group.command("publish")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the JWKS document here instead of stdout.")  # fmt: skip
@click.pass_obj
def publish(ctx: Ctx, out: Path | None) -> None:
    """Print the JWKS document (RFC 7517) of the home's ES256 identity key, which signs
    the identity tokens the egress broker presents (made on first use)."""
    document = IdentityKey.load_or_create(charter_home()).jwks()
    if out is None:
        click.echo(json.dumps(document, indent=2, sort_keys=True))
        return
    out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    ctx.status(f"wrote the JWKS to {out}")
