"""``charter agent add NAME --own-sandbox`` and ``--from FILE`` (docs/delegation.md):
the agent's profile is journaled with its registration (one append), a definition file
must scan clean (exit 4 with its findings otherwise), and a bad declaration is exit 2
with nothing journaled."""

from __future__ import annotations

import json
from pathlib import Path

from charter import catalogue as _catalogue  # noqa: F401  (registers every event type)
from charter.core import Budget
from charter.ledger import Journal
from tests.cli._run import charter

RESERVE = "tokens=10k,wall=1m,cpu=30s,mem=128MiB,egress=1MB"

DEFINITION = """
[[agent]]
name = "fetcher"
egress = ["api.test:443"]
secrets = ["gh"]
sandbox = "own"
run = ["/usr/bin/python3", "/opt/fetch.py"]

[agent.limits]
budget = "tokens=10k,wall=1m,cpu=30s,mem=128MiB,egress=1MB"
depth = 0
fanout = 0

[[secret]]
name = "gh"
bound_to = ["api.test:443"]
"""


def _declared(home: Path) -> list[dict[str, object]]:
    with Journal.open(f"sqlite:///{home}/journal.db") as journal:
        return [e.event.payload() for e in journal.entries(types=["OwnSandboxDeclared"])]


def _version(home: Path, name: str) -> int:
    """How many entries agent ``name``'s stream holds (its registration's)."""
    with Journal.open(f"sqlite:///{home}/journal.db") as journal:
        return journal.stream_version(f"agent:{name}")


def test_an_own_sandbox_agent_is_journaled_with_its_registration(home: Path) -> None:
    done = charter(
        "--json", "agent", "add", "fetcher", "--own-sandbox", "--delegate-budget", RESERVE,
        "--egress", "api.test:443", "--", "/usr/bin/python3", "/opt/fetch.py", home=home,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["own_sandbox"] == ["/usr/bin/python3", "/opt/fetch.py"]
    (declared,) = _declared(home)
    assert declared["argv"] == ["/usr/bin/python3", "/opt/fetch.py"]
    assert Budget.model_validate(declared["budget"]) == Budget.parse(RESERVE)
    assert _version(home, "fetcher") == 4  # registered, ceiling, ledger, profile
    # Positive control: a plain agent declares nothing.
    assert charter("agent", "add", "plain", home=home).returncode == 0
    assert len(_declared(home)) == 1


def test_a_bad_declaration_is_exit_2_and_journals_nothing(home: Path) -> None:
    cases = [
        ("--own-sandbox", "--delegate-budget", RESERVE),  # no program
        ("--own-sandbox", "--", "/bin/true"),  # no budget
        ("--delegate-budget", RESERVE, "--", "/bin/true"),  # not --own-sandbox
        ("--own-sandbox", "--delegate-budget", RESERVE, "--", "bin/true"),  # relative
        ("--own-sandbox", "--delegate-budget", "tokens=1", "--", "/bin/true"),  # not whole
        ("--own-sandbox", "--delegate-budget", RESERVE, "--depth", "0", "--", "/bin/true"),
        ("--own-sandbox", "--budget", RESERVE, "--delegate-budget",
         "tokens=20k,wall=1m,cpu=30s,mem=128MiB,egress=1MB", "--", "/bin/true"),  # over
    ]  # fmt: skip
    for args in cases:
        done = charter("agent", "add", "bad", *args, home=home)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert _version(home, "bad") == 0


def test_a_definition_file_registers_its_agent(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(DEFINITION)
    done = charter("--json", "agent", "add", "fetcher", "--from", str(path), home=home)
    assert done.returncode == 0, done.stderr
    (declared,) = _declared(home)
    assert declared["argv"] == ["/usr/bin/python3", "/opt/fetch.py"]
    ceiling = json.loads(done.stdout)["ceiling"]
    assert ceiling["egress"] == ["api.test:443"]
    assert ceiling["secrets"] == ["gh"]


def test_a_definition_that_does_not_scan_clean_is_refused(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "agents.toml"
    # Its secret is bound where its egress does not reach: a scan finding.
    path.write_text(DEFINITION.replace('bound_to = ["api.test:443"]', 'bound_to = ["x.test:1"]'))
    done = charter("agent", "add", "fetcher", "--from", str(path), home=home)
    assert done.returncode == 4, done.stderr
    assert "secret-unreachable" in done.stderr
    assert _version(home, "fetcher") == 0
    # A delegate that could spawn is not an own-sandbox agent (depth one).
    path.write_text(DEFINITION.replace("depth = 0", "depth = 1"))
    done = charter("agent", "add", "fetcher", "--from", str(path), home=home)
    assert done.returncode == 2, done.stderr
    assert "depth one" in done.stderr
    assert _version(home, "fetcher") == 0
