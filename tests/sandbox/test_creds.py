"""Held credentials through the egress broker, in real sandboxes against real TLS servers
on 127.0.0.1 whose CA is made here: mutual TLS, bearer headers bound to one destination,
identity tokens checked by an independent JOSE implementation, and test runs that
withhold everything."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest

from charter.core import Budget
from charter.core.identity import IdentityKey
from charter.core.secrets import HeldSecret, SecretStore, client_cert_from_pem
from charter.sandbox import (
    CredentialInjected,
    Credentials,
    CredentialWithheld,
    EgressBroker,
    EgressGrant,
    EgressOpened,
    Launcher,
    MemorySink,
    WarmPool,
)

from ._creds_support import FETCH, PKI, Server, resolver
from ._support import PY, out, sandboxed

pytestmark = pytest.mark.sandbox

B = Budget.parse("tokens=0,wall=30s,cpu=30s,mem=128MiB,egress=10MB")
TOKEN = "tok-" + secrets.token_hex(16)
API_KEY = "key-" + secrets.token_hex(16)


class World:
    """The servers, the home's held secrets, a broker holding them, a launcher."""

    def __init__(self, home: Path, state_dir: Path, sink: MemorySink) -> None:
        self.pki = PKI()
        self.api = Server(self.pki, "api.test")  # bearer-bound
        self.mtls = Server(self.pki, "mtls.test", require_client=True)
        self.ident = Server(self.pki, "id.test")
        self.other = Server(None)  # plain HTTP, allowed by the grant, bound to nothing
        self.client_cert, self.client_key = self.pki.issue("charter-client", server=False)
        store = SecretStore(home)
        ca = self.pki.pem
        store.add(HeldSecret("api-token", "bearer", (f"api.test:{self.api.port}",),
                             value=TOKEN.encode(), ca=ca))  # fmt: skip
        store.add(HeldSecret("api-key", "header", (f"api.test:{self.api.port}",),
                             value=API_KEY.encode(), header="X-Api-Key", ca=ca))  # fmt: skip
        store.add(HeldSecret("api-ident", "identity", (f"api.test:{self.api.port}",), ca=ca))
        chain, key = client_cert_from_pem(self.client_cert + self.client_key)
        store.add(HeldSecret("client", "client-cert", (f"mtls.test:{self.mtls.port}",),
                             value=chain, key=key, ca=ca))  # fmt: skip
        store.add(HeldSecret("ident", "identity", (f"id.test:{self.ident.port}",),
                             ca=ca, issuer="https://charter.test", ttl_s=120))  # fmt: skip
        self.identity = IdentityKey.load_or_create(home)
        self.credentials = Credentials(store.load_many(store.names()), self.identity)
        self.broker = EgressBroker(
            state_dir / f"egress-creds-{secrets.token_hex(4)}.sock",
            resolver=resolver, credentials=self.credentials,
        )  # fmt: skip
        self.launcher = Launcher(sink, state_dir=state_dir, egress=self.broker)
        self.sink = sink

    def grant(self, *secret_names: str, dry: bool = False) -> EgressGrant:
        dests = []
        for name, server in (("api.test", self.api), ("mtls.test", self.mtls),
                             ("id.test", self.ident), ("other.test", self.other)):  # fmt: skip
            dests += [f"{name}:{server.port}", f"127.0.0.1:{server.port}"]
        return EgressGrant(
            destinations=tuple(dests), secrets=secret_names, withhold_credentials=dry
        )

    def fetch(self, grant: EgressGrant, *targets: str) -> list[str]:
        outcome = sandboxed(self.launcher, B, FETCH, *targets, grant=grant)
        assert outcome.exit_code == 0, outcome.stderr
        return out(outcome).splitlines()

    def close(self) -> None:
        self.broker.close()
        for s in (self.api, self.mtls, self.ident, self.other):
            s.close()


@pytest.fixture
def world(tmp_path: Path, state_dir: Path, sink: MemorySink) -> Iterator[World]:
    w = World(tmp_path / "home", state_dir, sink)
    yield w
    w.close()


def test_the_mtls_destination_takes_the_held_certificate_and_refuses_one_without(
    world: World,
) -> None:
    url = f"http://mtls.test:{world.mtls.port}/"
    # Positive control: the grant names the held certificate; the broker presents it.
    answers = world.fetch(world.grant("client"), url)
    assert answers == ["200 ok with-authorization client=charter-client"]
    assert [s.client_cn for s in world.mtls.seen] == ["charter-client"]
    # Attack: the same sandbox without the secret in its grant opens its own TLS tunnel
    # (it has no certificate to present): the destination refuses the handshake.
    refused = world.mtls.refused_handshakes
    [answer] = world.fetch(world.grant(), f"CONNECT mtls.test:{world.mtls.port}")
    assert answer.startswith("tls-refused")
    assert world.mtls.refused_handshakes == refused + 1
    assert len(world.mtls.seen) == 1  # no request got through without the certificate
    injected = [e for e in world.sink.events if isinstance(e, CredentialInjected)]
    assert [(e.secret, e.kind, e.destination) for e in injected] == [
        ("client", "client-cert", f"mtls.test:{world.mtls.port}")
    ]


def test_a_bearer_token_goes_to_its_bound_destination_and_no_other(world: World) -> None:
    api, other = f"http://api.test:{world.api.port}/", f"http://other.test:{world.other.port}/x"
    answers = world.fetch(world.grant("api-token"), api, other)
    assert answers == ["200 ok with-authorization client=None"] * 2
    # Positive control: the bound destination got the held token, replacing the worker's.
    assert [s.headers["authorization"] for s in world.api.seen] == [f"Bearer {TOKEN}"]
    assert world.api.seen[0].headers["connection"] == "close"
    # Attack: another destination the grant allows gets only what the worker wrote.
    assert [s.headers["authorization"] for s in world.other.seen] == ["Bearer worker-made"]
    # Attack: naming the bound host in the Host header of a request for the other
    # destination does not move the token there (the dialed destination decides).
    answers = world.fetch(world.grant("api-token"), f"{other}|api.test:{world.api.port}")
    assert answers == ["200 ok with-authorization client=None"]
    assert all(TOKEN not in s.headers.get("authorization", "") for s in world.other.seen)
    # Attack: a grant that does not name the secret gets nothing injected at the bound
    # destination (the broker forwards its plain HTTP as is, which a TLS server refuses).
    before = len(world.api.seen)
    world.fetch(world.grant(), api)
    assert len(world.api.seen) == before
    # Journal: the secret's name and destination, never its value.
    injected = [e for e in world.sink.events if isinstance(e, CredentialInjected)]
    assert [(e.secret, e.destination) for e in injected] == [
        ("api-token", f"api.test:{world.api.port}")
    ]
    assert all(TOKEN not in e.model_dump_json() for e in world.sink.events)


def test_a_tunnel_to_a_credentialed_destination_is_refused(world: World) -> None:
    [answer] = world.fetch(world.grant("api-token"), f"CONNECT api.test:{world.api.port}")
    assert answer.startswith("HTTP/1.1 400 held credentials")
    assert world.api.accepted == 0


def test_an_identity_token_verifies_with_the_published_jwks(world: World) -> None:
    url = f"http://id.test:{world.ident.port}/"
    before = int(time.time())
    assert world.fetch(world.grant("ident"), url) == ["200 ok with-authorization client=None"]
    scheme, _, token = world.ident.seen[0].headers["authorization"].partition(" ")
    assert scheme == "Bearer"
    # PyJWT, not Charter, checks the signature against the published JWKS.
    jwks = jwt.PyJWKSet.from_dict(world.identity.jwks())
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "ES256"
    key = jwks[header["kid"]].key
    aud = f"https://id.test:{world.ident.port}"
    claims = jwt.decode(token, key, algorithms=["ES256"], audience=aud,
                        issuer="https://charter.test")  # fmt: skip
    assert claims["exp"] - claims["iat"] == 120  # short-lived, as the secret says
    assert before <= claims["iat"] <= int(time.time())
    assert claims["sub"].startswith("sandbox:")
    assert claims["sub"].endswith("/ident")
    # Audience-bound: the same token is refused for another destination.
    with pytest.raises(jwt.InvalidAudienceError):
        jwt.decode(token, key, algorithms=["ES256"], audience=f"https://api.test:{world.api.port}")
    # And a key other than the published one does not verify it.
    stranger = IdentityKey.load_or_create(world_home_other(world))
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, jwt.PyJWKSet.from_dict(stranger.jwks()).keys[0].key,
                   algorithms=["ES256"], audience=aud)  # fmt: skip


def world_home_other(world: World) -> Path:
    return Path(world.broker.path).parent / f"other-home-{secrets.token_hex(4)}"


def test_a_test_run_withholds_every_credential_and_journals_it(world: World) -> None:
    targets = [f"http://api.test:{world.api.port}/", f"http://mtls.test:{world.mtls.port}/",
               f"http://id.test:{world.ident.port}/"]  # fmt: skip
    answers = world.fetch(world.grant("api-token", "client", "ident", dry=True), *targets)
    assert answers == ["403 credentials withheld (test run)"] * 3
    # No destination was reached at all: nothing stands in for the withheld values.
    assert (world.api.accepted, world.mtls.accepted, world.ident.accepted) == (0, 0, 0)
    withheld = [e for e in world.sink.events if isinstance(e, CredentialWithheld)]
    assert sorted(e.secret for e in withheld) == ["api-token", "client", "ident"]
    assert not [e for e in world.sink.events if isinstance(e, CredentialInjected | EgressOpened)]
    # Control: the same grant, not a test run, reaches all three with their credentials.
    answers = world.fetch(world.grant("api-token", "client", "ident"), *targets)
    assert [a.split()[0] for a in answers] == ["200"] * 3
    assert (world.api.accepted, world.mtls.accepted, world.ident.accepted) == (1, 1, 1)


def test_a_warm_slot_gets_the_same_injection_and_withholding(
    world: World, state_dir: Path, scratch: Path
) -> None:
    url = f"http://api.test:{world.api.port}/"
    code = [PY, "-I", "-c", FETCH, url]
    with WarmPool(scratch, B, capacity=1, sink=world.sink, state_dir=state_dir,
                  egress=world.broker) as pool:  # fmt: skip
        slot = pool.lease(world.grant("api-token"))
        assert out(slot.run(code)).splitlines() == ["200 ok with-authorization client=None"]
        pool.release(slot)
        slot = pool.lease(world.grant("api-token", dry=True))
        assert out(slot.run(code)).splitlines() == ["403 credentials withheld (test run)"]
        pool.release(slot, refill=False)
    assert [s.headers["authorization"] for s in world.api.seen] == [f"Bearer {TOKEN}"]
    kinds = (CredentialInjected, CredentialWithheld)
    journaled = [type(e) for e in world.sink.events if isinstance(e, kinds)]
    assert journaled == [CredentialInjected, CredentialWithheld]


def test_a_destination_that_cannot_prove_its_name_never_sees_a_credential(
    world: World, tmp_path: Path, state_dir: Path, sink: MemorySink
) -> None:
    """The name resolves to an impostor whose certificate is for that name but from
    another CA: the broker's TLS refuses it before a byte of the request is sent."""
    impostor = Server(PKI("impostor CA"), "api.test")
    store = SecretStore(tmp_path / "home2")
    store.add(HeldSecret("tok", "bearer", (f"api.test:{impostor.port}",),
                         value=TOKEN.encode(), ca=world.pki.pem))  # fmt: skip
    with EgressBroker(state_dir / f"egress-imp-{secrets.token_hex(4)}.sock", resolver=resolver,
                      credentials=Credentials.from_home(tmp_path / "home2")) as broker:  # fmt: skip
        launcher = Launcher(sink, state_dir=state_dir, egress=broker)
        grant = EgressGrant(
            destinations=(f"api.test:{impostor.port}", f"127.0.0.1:{impostor.port}"),
            secrets=("tok",),
        )
        outcome = sandboxed(launcher, B, FETCH, f"http://api.test:{impostor.port}/", grant=grant)
    impostor.close()
    assert out(outcome).splitlines() == ["502 tls to the destination failed"]
    assert impostor.accepted == 1  # it was dialed...
    assert impostor.refused_handshakes == 1  # ...and its handshake failed on our side
    assert impostor.seen == []  # no request, so no token, ever reached it


def test_an_api_key_header_and_a_bearer_token_go_together_to_their_destination(
    world: World,
) -> None:
    api, other = f"http://api.test:{world.api.port}/", f"http://other.test:{world.other.port}/"
    assert (
        world.fetch(world.grant("api-key", "api-token"), api, other)
        == ["200 ok with-authorization client=None"] * 2
    )
    [seen] = world.api.seen
    assert (seen.headers["x-api-key"], seen.headers["authorization"]) == (
        API_KEY,
        f"Bearer {TOKEN}",
    )
    assert "x-api-key" not in world.other.seen[0].headers  # not bound there
    # Control: the header alone, without the bearer, leaves the worker's Authorization.
    world.fetch(world.grant("api-key"), api)
    assert world.api.seen[1].headers["authorization"] == "Bearer worker-made"
    assert world.api.seen[1].headers["x-api-key"] == API_KEY


def test_secrets_that_cannot_go_together_refuse_the_dial_before_anything(world: World) -> None:
    """A bearer token and an identity token both bound to one destination set the same
    header: the dial is refused before it is journaled or opened."""
    [answer] = world.fetch(
        world.grant("api-token", "api-ident"), f"http://api.test:{world.api.port}/"
    )
    assert answer.startswith("403 held credentials conflict")
    assert world.api.accepted == 0
    assert not [e for e in world.sink.events if isinstance(e, CredentialInjected | EgressOpened)]
    # Control: either one alone goes through.
    [answer] = world.fetch(world.grant("api-ident"), f"http://api.test:{world.api.port}/")
    assert answer.startswith("200")
