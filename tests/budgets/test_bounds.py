"""Every integer a request or an event carries is bounded to what both databases store
(2^63 − 1), numbers are ASCII, and a projection never fails on any value an event model
accepts. Out-of-range input is refused at the boundary (exit 2) with nothing journaled."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import Ceiling
from charter.core import Budget, BudgetSyntaxError, CharterError, KeyStore
from charter.core.budget import INT64_MAX
from charter.ledger import Journal
from tests.journal.test_cli import charter

OK = "tokens=1k,wall=1m,cpu=1m,mem=1MiB,egress=1MB"


@pytest.mark.parametrize(
    "text",
    [
        f"tokens={INT64_MAX + 1},wall=1s,cpu=1s,mem=0,egress=0",
        "tokens=10000000000000000000k,wall=1s,cpu=1s,mem=0,egress=0",
        "tokens=" + "9" * 5000 + ",wall=1s,cpu=1s,mem=0,egress=0",
        "tokens=𝟗,wall=1s,cpu=1s,mem=0,egress=0",  # a mathematical digit nine
        "tokens=٣,wall=1s,cpu=1s,mem=0,egress=0",  # an Arabic-Indic three
        "tokens=1,wall=9223372036854776s,cpu=1s,mem=0,egress=0",  # too many ms
    ],
)
def test_out_of_range_and_non_ascii_quantities_are_refused(text: str) -> None:
    with pytest.raises(BudgetSyntaxError):
        Budget.parse(text)


def test_the_largest_quantity_is_accepted_and_one_more_is_not() -> None:
    top = Budget.parse(f"tokens={INT64_MAX},wall=1s,cpu=1s,mem=0,egress=0")
    assert top.tokens == INT64_MAX
    with pytest.raises(ValidationError):
        Budget(tokens=INT64_MAX + 1, wall_ms=0, cpu_ms=0, mem_bytes=0, egress_bytes=0)


def _head(home: Path) -> tuple[int, bytes] | None:
    with Journal.open(f"sqlite:///{home / 'journal.db'}") as journal:
        return journal.head()


@pytest.mark.parametrize(
    "args",
    [
        ("agent", "add", "big", "--budget", f"tokens={INT64_MAX + 1},wall=1h,cpu=1h,mem=0,egress=0"),  # noqa: E501
        ("agent", "add", "big", "--budget", "tokens=𝟗,wall=1h,cpu=1h,mem=0,egress=0"),
        ("agent", "add", "big", "--budget", OK, "--ttl", str(10**12)),
        ("lease", "renew", "agent:root/sa-1", "--until-ms", str(10**20)),
        ("lease", "renew", "agent:root/sa-1", "--until-ms", "1e20"),
        (
            "spawn", "--parent", "agent:root", "--width", "1", "--objective", "scan the hosts",
            "--est-cost", "tokens=" + "9" * 5000 + ",wall=1s,cpu=1s,mem=0,egress=0",
        ),
    ],
)  # fmt: skip
def test_the_cli_refuses_them_with_exit_2_and_journals_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    home = tmp_path / "home"
    assert charter("init", home=home).returncode == 0
    before = _head(home)
    result = charter(*args, home=home)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert _head(home) == before
    # Control: the projections still answer.
    assert charter("budgets", home=home).returncode == 0


@pytest.mark.parametrize("backend_url", ["sqlite_url", "pg_url"])
def test_projections_answer_for_the_largest_values(
    backend_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue(backend_url))
    top = Budget(
        tokens=INT64_MAX,
        wall_ms=INT64_MAX,
        cpu_ms=INT64_MAX,
        mem_bytes=INT64_MAX,
        egress_bytes=INT64_MAX,
    )
    made, _ = Charter.initialise(
        url,
        root="root",
        ceiling=Ceiling(budget=top, ttl_s=100 * 365 * 86_400),
        cell=CellSetup(cores=2),
        keys=KeyStore(tmp_path / "home"),
        settings=Settings(),
    )
    with made as c:
        intent = SpawnIntent(width=2, objective="scan the estate host by host", estimated_cost=top)
        result = c.spawn("agent:root", intent, policy=FixedPolicy(Verdict.POSITIVE))
        child = str(result.children[0].lineage)
        c.budgets().record_usage(child, top.split(3))
        with c.projector() as projector:
            projector.catch_up()
            line = projector.budgets().get(child)
            assert line.allocation == top.split(2)
            assert projector.tree().nodes
            assert projector.slots().cells
            assert projector.rebuild() > 0
            assert projector.budgets().get(child) == line


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.integers(min_value=0, max_value=INT64_MAX), min_size=5, max_size=5),
    st.integers(min_value=1, max_value=4),
)
def test_any_budget_the_model_accepts_projects(
    tmp_path_factory: pytest.TempPathFactory, axes: list[int], width: int
) -> None:
    tmp = tmp_path_factory.mktemp("bounds")
    budget = Budget(**dict(zip(Budget.AXES, axes, strict=True)))
    made, _ = Charter.initialise(
        f"sqlite:///{tmp / 'j.db'}",
        root="root",
        ceiling=Ceiling(budget=budget),
        cell=CellSetup(cores=2),
        keys=KeyStore(tmp / "home"),
        settings=Settings(),
    )
    with made as c:
        intent = SpawnIntent(
            width=width, objective="scan the estate host by host", estimated_cost=budget
        )
        # A refusal (a CharterError) is fine; anything else fails the test.
        with contextlib.suppress(CharterError):
            c.spawn("agent:root", intent, policy=FixedPolicy(Verdict.POSITIVE))
        with c.projector() as projector:
            projector.catch_up()
            doc = projector.budgets().to_json()
            assert json.loads(json.dumps(doc))["ledgers"]


@pytest.mark.parametrize("width", ["٣", "𝟗", "1e3", "3.0"])
def test_cli_numbers_are_ascii_whole_numbers(tmp_path: Path, width: str) -> None:
    home = tmp_path / "home"
    assert charter("init", home=home).returncode == 0
    before = _head(home)
    args = ("spawn", "--parent", "agent:root", "--width", width, "--objective", "scan the hosts")
    cost = "tokens=300k,wall=3m,cpu=3m,mem=3MiB,egress=3MB"
    result = charter(*args, "--est-cost", cost, home=home)
    assert result.returncode == 2, result.stderr
    assert _head(home) == before
    control = charter(*args[:4], "3", *args[5:], "--est-cost", cost, home=home)
    assert control.returncode == 0, control.stderr
