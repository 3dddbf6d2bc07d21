"""Held credentials at the egress broker (docs/credentials.md,
``charter/sandbox/egress.py``) as an audit rule (``credential``, docs/VERIFYING.md §9):
a secret injected that the sandbox's grant does not name, to a destination its egress
does not admit, without its dial's ``EgressOpened`` in the same append, in a sandbox
never leased, or in a test run's sandbox that withheld credentials. Each beside a positive
control: the broker's own appends are clean. The grants are the product's (a root whose
ceiling names the secret and the egress, a fan-out under it); the broker's entries are
appended past the control layer, validly chained, as an attacker with write access
would. SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

import charter.catalogue  # noqa: F401  (registers every event type)
from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, RequestedGrant, SpawnIntent, Verdict
from charter.control import Ceiling
from charter.core import Budget, KeyStore
from charter.core.secrets import HeldSecret, SecretStore
from charter.sandbox.events import CredentialInjected, CredentialWithheld, EgressOpened
from tests.audit.test_semantic import _append, _audit, _leased, _only

DEST = "api.example.com:443"


@pytest.fixture
def granted(journal_url: str, tmp_path: Path) -> tuple[str, list[str]]:
    """A product history: a root whose ceiling holds secret ``gh`` and egress to
    ``api.example.com``, and a fan-out of 2 under it holding them."""
    # The home holds gh, bound to the api: its grant's egress there is no way out (a
    # secret bound to nothing with public egress would be the lethal trifecta: docs/scan.md).
    SecretStore(tmp_path / "home").add(
        HeldSecret("gh", "bearer", ("api.example.com",), value=b"t0ken")
    )
    ceiling = Ceiling(
        budget=Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=8GiB,egress=1GB"),
        egress=frozenset({"api.example.com"}),
        secrets=frozenset({"gh"}),
    )
    charter, _ = Charter.initialise(
        journal_url,
        root="estate",
        ceiling=ceiling,
        cell=CellSetup(cores=8, reserve=1),
        keys=KeyStore(tmp_path / "home"),
        settings=Settings(),
    )
    with charter:
        root = charter.spawn_service().durable_caller("estate")
        fanout = charter.spawn(
            root,
            SpawnIntent(
                width=2,
                objective="call the api",
                estimated_cost=Budget.parse("tokens=10k,wall=1m,cpu=1m,mem=64MiB,egress=1MB"),
                grant=RequestedGrant(
                    secrets=frozenset({"gh"}), egress=frozenset({"api.example.com"})
                ),
            ),
            policy=FixedPolicy(Verdict.POSITIVE),
        )
        lineages = [str(c.lineage) for c in fanout.children]
    assert _audit(journal_url).ok
    return journal_url, lineages


def _sandbox(url: str, sandbox: str, lineage: str | None, egress: tuple[str, ...]) -> None:
    _append(url, _leased(sandbox, lineage).model_copy(update={"egress": egress}))


def _dial(sandbox: str, dest: str = DEST) -> EgressOpened:
    return EgressOpened(sandbox_id=sandbox, host_uid=100_000, destination=dest, address="192.0.2.1")


def _injected(sandbox: str, secret: str = "gh", dest: str = DEST) -> CredentialInjected:
    return CredentialInjected(
        sandbox_id=sandbox, host_uid=100_000, secret=secret, kind="bearer", destination=dest
    )


def _withheld(sandbox: str) -> CredentialWithheld:
    return CredentialWithheld(
        sandbox_id=sandbox, host_uid=100_000, secret="gh", destination=DEST, reason="test run"
    )


def test_a_credential_goes_only_where_the_grant_and_egress_say(granted: tuple) -> None:
    url, lineages = granted
    _sandbox(url, "s0", lineages[0], ("api.example.com",))
    _sandbox(url, "s1", lineages[1], ("*.example.com:8443",))
    _sandbox(url, "op", None, ("api.example.com",))
    _append(url, _dial("s0"), _injected("s0"))  # as the broker appends: with its dial
    _append(url, _dial("s1", "x.example.com:8443"), _injected("s1", dest="x.example.com:8443"))
    # An operator's sandbox (`charter sandbox run --secrets`): its secrets are not
    # journaled, so only its egress and its dial are checked.
    _append(url, _dial("op"), _injected("op", secret="anything"))
    assert _audit(url).ok  # positive control
    (ungranted,) = _append(url, _dial("s0"), _injected("s0", secret="prod-db"))[1:]
    (elsewhere,) = _append(
        url, _dial("s0", "evil.test:443"), _injected("s0", dest="evil.test:443")
    )[1:]
    (port,) = _append(
        url, _dial("s1", "x.example.com:443"), _injected("s1", dest="x.example.com:443")
    )[1:]
    (alone,) = _append(url, _injected("s0"))  # no dial in its append
    (other,) = _append(url, _dial("s1"), _injected("s0"))[1:]  # another sandbox's dial
    (operator,) = _append(url, _dial("op", "evil.test:443"), _injected("op", dest="evil.test:443"))[
        1:
    ]
    (unleased,) = _append(url, _dial("ghost"), _injected("ghost"))[1:]
    report = _audit(url)
    assert _only(report, "credential") == [
        ungranted,
        elsewhere,
        port,
        alone,
        other,
        operator,
        unleased,
    ]
    assert {f.check for f in report.findings} == {"credential"}


def test_a_test_run_injects_no_credential(granted: tuple) -> None:
    url, lineages = granted
    _sandbox(url, "test", lineages[0], ("api.example.com",))
    _sandbox(url, "real", lineages[1], ("api.example.com",))
    _append(url, _withheld("test"), _withheld("test"))  # every dial of a test run
    _append(url, _dial("real"), _injected("real"))
    assert _audit(url).ok  # positive control: the real run's sandbox injects
    (after,) = _append(url, _dial("test"), _injected("test"))[1:]
    (before,) = _append(url, _withheld("real"))  # the real run now says it is a test run
    assert _only(_audit(url), "credential") == [after, before]
