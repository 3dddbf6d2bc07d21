"""The cell's path: a worker whose sealed grant names a held secret gets it injected by
the cell's egress broker at the secret's destination; a sibling whose grant reaches the
same destination without naming the secret gets nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from charter.app import Charter
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import WorkerSpec
from charter.core import Budget
from charter.runner.events import WorkerResult
from charter.sandbox import CredentialInjected, SandboxLeased
from tests.runner._support import make_cell, running, until_idle

from ._creds_support import FETCH, token_estate

pytestmark = pytest.mark.sandbox

ROOT = Budget.parse("tokens=1M,wall=1h,cpu=1h,mem=4GiB,egress=1GB")
SLOT = Budget.parse("tokens=0,wall=60s,cpu=60s,mem=256MiB,egress=10MB")
TOKEN = "cell-token-0123456789abcdef"


def _spawn(charter: Charter, url: str, grant: dict[str, object]) -> str:
    intent = SpawnIntent.model_validate({
        "width": 1, "objective": "fetch with a held credential", "grant": grant,
        "estimated_cost": Budget.parse("tokens=1000,wall=60s,cpu=60s,mem=64MiB,egress=1MB"),
    })  # fmt: skip
    result = charter.spawn(
        "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE),
        workers=(WorkerSpec(argv=("/usr/bin/python3", "-I", "-c", FETCH, url)),),
    )  # fmt: skip
    return str(result.children[0].lineage)


def test_a_cell_worker_gets_only_the_secrets_its_grant_names(
    tmp_path: Path, state_dir: Path
) -> None:
    charter, server, where = token_estate(tmp_path, TOKEN, ROOT)
    url = f"http://{where[0]}/"
    with charter:
        named = _spawn(charter, url, {"egress": where, "secrets": ["tok"]})
        # (A grant that leaves secrets unset inherits its parent's, as every set axis.)
        unnamed = _spawn(charter, url, {"egress": where, "secrets": []})
        with running(make_cell(charter, None, state_dir, budget=SLOT)) as cell:
            until_idle(cell)
        results = {e.event.lineage: e.event.text for e in charter.journal.entries(
            types=("WorkerResult",)) if isinstance(e.event, WorkerResult)}  # fmt: skip
        leased = [e.event for e in charter.journal.entries(types=("SandboxLeased",))]
        injected = [e.event for e in charter.journal.entries(types=("CredentialInjected",))]
    server.close()
    # Positive control: the worker whose grant names the secret got it injected.
    assert results[named].split()[:2] == ["200", "ok"]
    assert [s.headers["authorization"] for s in server.seen] == [f"Bearer {TOKEN}"]
    # Attack: its sibling reaches the same destination, but nothing is injected for it:
    # its plain HTTP reaches a TLS server as is, and no request of it is served.
    assert not results[unnamed].startswith("200")
    assert len(server.seen) == 1
    uids = {ev.lineage: ev.host_uid for ev in leased if isinstance(ev, SandboxLeased)}
    assert [(e.secret, e.host_uid) for e in injected if isinstance(e, CredentialInjected)] == [
        ("tok", uids[named])
    ]
