"""``charter scan PATH…`` (docs/scan.md): each rule flagged on a crafted definition, a
clean one passes; exit 0 clean, 4 on findings, 2 for a definition that is not valid;
``--json`` for CI. Run as the real command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from charter.core.secrets import HeldSecret, SecretStore
from tests.cli._run import charter

CLEAN = """
[[agent]]
name = "fetcher"
egress = ["api.github.com", "10.0.0.7:8443"]
secrets = ["gh"]

[[agent]]
name = "delegate"
egress = ["pypi.org"]
sandbox = "own"
[agent.limits]
budget = "tokens=200k,wall=10m,cpu=60s,mem=512MiB,egress=20MB"
depth = 0
fanout = 0

[[secret]]
name = "gh"
bound_to = ["api.github.com"]
"""

TRIFECTA = """
[[agent]]
name = "triage"
egress = ["api.github.com", "pypi.org"]
secrets = ["gh"]

[[secret]]
name = "gh"
bound_to = ["api.github.com"]
"""

# CLEAN's fetcher, but reading untrusted input: its own API becomes a way out.
UNTRUSTED_INPUT = """
[agent]
name = "mailer"
egress = ["api.github.com"]
secrets = ["gh"]
untrusted = true

[[secret]]
name = "gh"
bound_to = ["api.github.com"]
"""

UNREACHABLE = """
[[agent]]
name = "deployer"
egress = ["10.0.0.7:8443"]
secrets = ["gh", "ghost"]

[[secret]]
name = "gh"
bound_to = ["uploads.github.com"]
"""

NO_LIMITS = """
[[agent]]
name = "helper"
egress = ["pypi.org"]
sandbox = "own"
[agent.limits]
depth = 0
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _scan(*args: str, home: Path | None = None) -> tuple[int, dict[str, object]]:
    done = charter("--json", "scan", *args, home=home)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}


def test_a_clean_definition_passes(tmp_path: Path) -> None:
    code, doc = _scan(str(_write(tmp_path, "clean.toml", CLEAN)), "--no-home")
    assert code == 0, doc
    assert doc["ok"] is True
    assert doc["checked"] == 2
    assert doc["findings"] == []


@pytest.mark.parametrize(
    ("text", "rule", "agent", "count"),
    [
        (TRIFECTA, "trifecta", "triage", 1),
        (UNTRUSTED_INPUT, "trifecta", "mailer", 1),
        (UNREACHABLE, "secret-unreachable", "deployer", 2),  # bound elsewhere, unbound
        (NO_LIMITS, "own-sandbox-without-limits", "helper", 1),
    ],
)
def test_each_rule_is_flagged(tmp_path: Path, text: str, rule: str, agent: str, count: int) -> None:
    path = _write(tmp_path, "crafted.toml", text)
    code, doc = _scan(str(path), "--no-home")
    assert code == 4, doc
    findings = doc["findings"]
    assert isinstance(findings, list)
    assert [(f["rule"], f["agent"], f["file"]) for f in findings] == [
        (rule, agent, str(path))
    ] * count
    assert doc["ok"] is False


def test_a_directory_is_scanned_and_human_output_names_each_finding(tmp_path: Path) -> None:
    _write(tmp_path, "a.toml", CLEAN)
    _write(tmp_path, "b.toml", TRIFECTA)
    done = charter("scan", str(tmp_path), "--no-home")
    assert done.returncode == 4
    assert "triage: trifecta:" in done.stdout
    assert "1 scan finding" in done.stderr


def test_the_homes_bindings_and_policy_are_used(tmp_path: Path) -> None:
    home = tmp_path / "home"
    SecretStore(home).add(HeldSecret("gh", "bearer", ("api.github.com",), value=b"t0ken"))
    text = (
        '[[agent]]\nname = "fetcher"\negress = ["api.github.com", "10.0.0.7"]\nsecrets = ["gh"]\n'
    )
    path = _write(tmp_path, "home.toml", text)
    code, doc = _scan(str(path), home=home)  # gh's binding from the home: clean
    assert code == 0, doc
    code, doc = _scan(str(path), "--no-home", home=home)  # bound to nothing known
    assert code == 4
    rules = {f["rule"] for f in doc["findings"]}  # type: ignore[attr-defined]
    assert rules == {"trifecta", "secret-unreachable"}
    lethal = _write(tmp_path, "lethal.toml", TRIFECTA.replace('"triage"', '"fetcher"'))
    assert _scan(str(lethal), home=home)[0] == 4
    (home / "trifecta.json").write_text('{"allow": ["agent:fetcher"]}')
    assert _scan(str(lethal), home=home)[0] == 0  # the operator's allow: positive control


@pytest.mark.parametrize(
    "text",
    [
        "[[agent]]\nname = 'x'\negress = ['https://bad']\n",  # not an egress entry
        "[[agent]]\nname = 'x'\ncolour = 'red'\n",  # unknown key
        "[[agent]\n",  # not TOML
        "[[agent]]\nname = 'x'\nsandbox = 'own'\n[agent.limits]\nbudget = 'tokens=1'\n",
    ],
)
def test_a_definition_that_is_not_valid_exits_2(tmp_path: Path, text: str) -> None:
    done = charter("scan", str(_write(tmp_path, "bad.toml", text)), "--no-home")
    assert done.returncode == 2, done.stderr
    assert "bad.toml" in done.stderr
