"""The lethal trifecta, refused at mint (docs/scan.md): the definition, the operator's
spawn (Python API and CLI) and a worker's spawn through its door (a real sandbox)
refused with ``lethal-trifecta`` and journaled, the operator's allow as positive
control."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from charter.app import CellSetup, Charter, Settings
from charter.authority import (
    FixedPolicy,
    LethalTrifectaError,
    SpawnIntent,
    SpawnRefused,
    Verdict,
    assess,
    private_destination,
)
from charter.control import Ceiling
from charter.core import Budget, KeyStore
from charter.core.secrets import HeldSecret, SecretStore
from charter.runner.events import WorkerResult
from tests.runner.conftest import state_dir  # noqa: F401  (the sandboxes' state)

ROOT = Path(__file__).resolve().parents[2]
BUDGET = Budget.parse("tokens=1M,wall=2h,cpu=2h,mem=64GiB,egress=1GB")
COST = Budget.parse("tokens=20k,wall=2m,cpu=2m,mem=1GiB,egress=1MB")
GH = "api.github.com"


def _bindings(table: dict[str, tuple[str, ...]]):  # type: ignore[no-untyped-def]
    return lambda name: table.get(name, ())


@pytest.mark.parametrize(
    ("egress", "secrets", "bound", "lethal"),
    [
        ({GH}, {"gh"}, {"gh": (GH,)}, False),  # a credential's own API: no way out
        ({GH, "pypi.org"}, {"gh"}, {"gh": (GH,)}, True),  # pypi.org is a way out
        ({GH}, {"gh"}, {}, True),  # a secret bound to nothing: its API is a way out
        ({"127.0.0.1:8080"}, {"gh"}, {}, False),  # no public destination at all
        ({"10.0.0.7:8443", "pypi.org"}, set(), {}, True),  # a private address and out
        ({"[fd00::/8]", "*.example.com"}, set(), {}, True),
        ({"pypi.org", "*.example.com"}, set(), {}, False),  # no private data
        ({"0.0.0.0/0"}, set(), {}, True),  # a range of both
        ({"10.0.0.0/8", "169.254.169.254"}, {"gh"}, {}, False),  # private only
        ({"localhost:8080", "db.internal", "*.local"}, {"gh"}, {}, False),  # private names
        ({"localhost:8080", "pypi.org"}, set(), {}, True),
    ],
)
def test_the_definition(
    egress: set[str], secrets: set[str], bound: dict[str, tuple[str, ...]], lethal: bool
) -> None:
    assert assess(egress, secrets, _bindings(bound)).lethal is lethal


def test_private_destinations() -> None:
    for entry in ("10.0.0.7", "172.16.0.0/12", "192.168.1.1:80", "127.0.0.1:9", "[::1]",
                  "169.254.169.254", "100.64.0.1", "[fe80::/10]", "localhost", "x.localhost",
                  "*.internal", "nas.home.arpa:443", "printer.local"):  # fmt: skip
        assert private_destination(entry), entry
    for entry in ("8.8.8.8", "api.github.com", "*.example.com", "[2001:4860::8888]",
                  "notlocalhost.com", "local.example.com"):  # fmt: skip
        assert not private_destination(entry), entry


def _charter(tmp_path: Path, *, allow: list[str] | None = None) -> Charter:
    home = tmp_path / "home"
    SecretStore(home).add(HeldSecret("gh", "bearer", (GH,), value=b"t0ken"))
    if allow is not None:
        home.mkdir(parents=True, exist_ok=True)
        (home / "trifecta.json").write_text(json.dumps({"allow": allow}))
    charter, _ = Charter.initialise(
        f"sqlite:///{tmp_path}/journal.db", root="estate",
        ceiling=Ceiling(budget=BUDGET, depth=4, fanout=20, secrets=frozenset({"gh"}),
                        egress=frozenset({GH, "10.0.0.7:8443", "pypi.org"})),
        cell=CellSetup(cores=2, processing=2, coordination=2), keys=KeyStore(home),
        settings=Settings(),
    )  # fmt: skip
    return charter


def _spawn(charter: Charter, grant: dict[str, object], *workers: object) -> object:
    intent = SpawnIntent.model_validate(
        {"width": 1, "objective": "work", "estimated_cost": COST, "grant": grant}
    )
    return charter.spawn(
        "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE),
        workers=tuple(workers) or None,  # type: ignore[arg-type]
    )  # fmt: skip


def test_an_operators_trifecta_spawn_is_refused_and_journaled(tmp_path: Path) -> None:
    with _charter(tmp_path) as charter:
        with pytest.raises(LethalTrifectaError) as refused:
            _spawn(charter, {})  # inherits all: gh, a private address, pypi.org
        assert "pypi.org" in str(refused.value)
        assert "secret gh" in str(refused.value)
        (event,) = [e.event for e in charter.journal.entries(types=("SpawnRefused",))]
        assert isinstance(event, SpawnRefused)
        assert event.reason == "lethal-trifecta"
        before = len(list(charter.journal.entries(types=("GrantMinted",))))
        # Positive controls: the same parent, narrowed to one leg less, mints.
        _spawn(charter, {"egress": [GH, "10.0.0.7:8443"]})  # gh's own API, private: in
        _spawn(charter, {"egress": ["pypi.org"], "secrets": []})  # public only, no data
        assert len(list(charter.journal.entries(types=("GrantMinted",)))) == before + 2


def test_the_operators_policy_allows_what_it_names(tmp_path: Path) -> None:
    with _charter(tmp_path, allow=["agent:estate"]) as charter:
        result = _spawn(charter, {})  # the positive control: allowed by name
        assert len(result.children) == 1  # type: ignore[attr-defined]


def test_a_policy_file_not_of_its_shape_is_refused(tmp_path: Path) -> None:
    from charter.control.trifecta import home_trifecta
    from charter.core import BadInputError

    (tmp_path / "trifecta.json").write_text('{"allow": "agent:estate"}')
    with pytest.raises(BadInputError):
        home_trifecta(tmp_path)
    (tmp_path / "trifecta.json").write_text('{"allow": ["not a lineage"]}')
    with pytest.raises(BadInputError):
        home_trifecta(tmp_path)


def test_the_cli_spawn_exits_4_with_the_reason(tmp_path: Path) -> None:
    _charter(tmp_path).close()
    env = os.environ | {
        "CHARTER_HOME": str(tmp_path / "home"),
        "CHARTER_DB": f"sqlite:///{tmp_path}/journal.db",
        "PYTHONPATH": str(ROOT),
    }
    cost = "tokens=20k,wall=2m,cpu=2m,mem=512MiB,egress=1MB"
    args = ["--json", "spawn", "--parent", "agent:estate", "--width", "1", "--objective",
            "summarise the release notes", "--est-cost", cost]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "charter", *args], env=env, check=False,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert "refused (lethal-trifecta)" in done.stderr
    narrowed = [*args, "--grant", json.dumps({"egress": [GH]})]
    done = subprocess.run([sys.executable, "-m", "charter", *narrowed], env=env, check=False,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr


# A worker whose own grant is safe (gh and its API, a private address) asks for a child
# without the secret: the API is then no longer gh's, so it becomes a way out for what
# the private address holds. Refused at its mint; narrowed, it mints.
SPAWNER = """
import sys, json
sys.path.insert(0, '/workspace')
import charter_door
door = charter_door.Door()
cost = {"tokens": 8000, "wall_ms": 60000, "cpu_ms": 60000, "mem_bytes": 1 << 28,
        "egress_bytes": 0}
def code(grant):
    try:
        door.spawn({"width": 1, "objective": "summarise the release notes", "estimated_cost": cost,
                    "grant": grant},
                   [{"argv": ["/bin/true"]}])
        return "ok"
    except charter_door.DoorError as e:
        return (e.data or {}).get("reason")
out = {"lethal": code({"secrets": []}),
       "narrowed": code({"secrets": [], "egress": ["10.0.0.7:8443"]})}
door.result(json.dumps(out))
"""


@pytest.mark.sandbox
@pytest.mark.parametrize("allowed", [False, True], ids=["refused", "allowed-by-policy"])
def test_a_workers_trifecta_spawn_through_the_door_is_refused(
    tmp_path: Path,
    state_dir: Path,  # noqa: F811 (the fixture imported above)
    allowed: bool,
) -> None:
    from charter.control import WorkerSpec
    from tests.runner._support import make_cell, running, until_idle

    allow = ["agent:estate/sa-1"] if allowed else None
    with _charter(tmp_path, allow=allow) as charter:
        worker = WorkerSpec(argv=("/usr/bin/python3", "-I", "-c", SPAWNER))
        _spawn(charter, {"egress": [GH, "10.0.0.7:8443"], "fanout": 4}, worker)
        with running(make_cell(charter, None, state_dir, door=True)) as cell:
            until_idle(cell)
        (answer,) = [e.event for e in charter.journal.entries(types=("WorkerResult",))]
        assert isinstance(answer, WorkerResult)
        out = json.loads(answer.text)
        assert out["narrowed"] == "ok"  # positive control
        refusals = [e.event.reason for e in charter.journal.entries(types=("SpawnRefused",))
                    if isinstance(e.event, SpawnRefused)]  # fmt: skip
        if allowed:
            assert out["lethal"] == "ok"
            assert refusals == []
        else:
            assert out["lethal"] == "lethal-trifecta"
            assert refusals == ["lethal-trifecta"]
