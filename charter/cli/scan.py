"""``charter scan PATH…``: lint agent definitions (TOML, docs/scan.md) before they run.

Rules (each finding names its file, agent and rule):

* ``trifecta``: the agent would hold private data, untrusted content and a way out
  (the mint's own definition, :func:`charter.authority.assess`), and the operator's
  policy (``<home>/trifecta.json``) does not name it;
* ``secret-unreachable``: a secret is bound to a destination the agent's egress does
  not reach (it would never be presented), or to none at all;
* ``own-sandbox-without-limits``: an ``sandbox = "own"`` agent without a whole budget
  (all five axes), a ``depth`` and a ``fanout`` in its ``[limits]``.

Exit 0 when clean, 4 on any finding (refused by policy), 2 for a definition that is
not valid (its file and field named). ``--json`` for CI: ``{"ok", "checked", "files",
"findings": [{"rule", "file", "agent", "detail"}]}``.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from charter.authority import assess
from charter.cli._common import Ctx
from charter.core import BadInputError, Budget, Lineage
from charter.core.destination import Destination, covers
from charter.core.errors import describe_invalid
from charter.core.home import charter_home
from charter.core.secrets import SecretName

__all__ = ["AgentDefinition", "Definitions", "Finding", "load", "scan", "scan_home", "scan_paths"]

RULES = ("trifecta", "secret-unreachable", "own-sandbox-without-limits")


class _Closed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Limits(_Closed):
    budget: str | None = None
    depth: int | None = Field(default=None, ge=0)
    fanout: int | None = Field(default=None, ge=0)


class AgentDefinition(_Closed):
    """One agent: what its grant would hold."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9-]*$")
    egress: tuple[Destination, ...] = ()
    secrets: tuple[SecretName, ...] = ()
    tools: tuple[str, ...] = ()
    untrusted: bool = False
    """It reads untrusted input (issues, mail, web pages) besides what its egress brings."""
    sandbox: Literal["shared", "own"] = "shared"
    limits: Limits | None = None
    run: tuple[str, ...] = Field(default=(), max_length=256)
    """What an own-sandbox agent runs (``charter agent add --from``): argv, absolute."""


class SecretBinding(_Closed):
    name: SecretName
    bound_to: tuple[Destination, ...] = Field(min_length=1)


class Definitions(_Closed):
    """One file: ``[[agent]]`` tables (or one ``[agent]``) and ``[[secret]]`` bindings."""

    agent: tuple[AgentDefinition, ...] = ()
    secret: tuple[SecretBinding, ...] = ()


@dataclass(frozen=True)
class Finding:
    rule: str
    file: str
    agent: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "file": self.file, "agent": self.agent, "detail": self.detail}


def load(path: Path) -> Definitions:
    """A definitions file, validated (BadInputError naming the file and field)."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise BadInputError(f"{path}: cannot read it ({e.strerror or e})") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path}: not TOML ({e})") from e
    if isinstance(doc.get("agent"), dict):  # one [agent] table
        doc["agent"] = [doc["agent"]]
    try:
        return Definitions.model_validate(doc)
    except ValidationError as e:
        raise BadInputError(f"{path}: {describe_invalid(e)}") from e


def _home_bindings(home: Path | None) -> dict[str, tuple[str, ...]]:
    """The bindings of the secrets the home holds (none when there is no home)."""
    if home is None:
        return {}
    from charter.core.errors import CharterError
    from charter.core.secrets import SecretStore

    store = SecretStore(home)
    found: dict[str, tuple[str, ...]] = {}
    try:
        names = store.names()
    except CharterError:
        return {}
    for name in names:
        try:
            found[name] = store.load(name).bound_to
        except CharterError:
            continue
    return found


def _home_allow(home: Path | None) -> frozenset[str]:
    if home is None or not (home / "trifecta.json").exists():
        return frozenset()
    from charter.control.trifecta import home_trifecta

    return home_trifecta(home).allow


def scan(
    definitions: Definitions,
    file: str,
    *,
    bindings: dict[str, tuple[str, ...]] | None = None,
    allow: frozenset[str] = frozenset(),
) -> list[Finding]:
    """The findings of one file's agents. Bindings: the file's ``[[secret]]`` tables,
    else ``bindings`` (the home's store); ``allow``: lineages the operator's policy names."""
    bound = dict(bindings or {})
    bound.update({s.name: s.bound_to for s in definitions.secret})
    findings: list[Finding] = []
    for agent in definitions.agent:

        def find(rule: str, detail: str, agent: AgentDefinition = agent) -> None:
            findings.append(Finding(rule, file, agent.name, detail))

        exposure = assess(
            agent.egress, agent.secrets, lambda n: bound.get(n, ()),
            untrusted_input=agent.untrusted,
        )  # fmt: skip
        if exposure.lethal and str(Lineage.root(agent.name)) not in allow:
            find("trifecta", f"it would combine {exposure.describe()}")
        for name in agent.secrets:
            targets = bound.get(name, ())
            if not targets:
                find("secret-unreachable", f"secret {name} is bound to no destination known")
            for target in targets:
                if not any(covers(e, target) for e in agent.egress):
                    find(
                        "secret-unreachable",
                        f"secret {name} is bound to {target}, which its egress does not "
                        "reach: it would never be presented",
                    )
        if agent.sandbox == "own":
            missing = _missing_limits(agent.limits, file)
            if missing:
                find(
                    "own-sandbox-without-limits",
                    f"an own-sandbox agent without {', '.join(missing)} in [limits]",
                )
    return findings


def _missing_limits(limits: Limits | None, file: str) -> list[str]:
    if limits is None:
        return ["budget", "depth", "fanout"]
    missing = [] if limits.budget is not None else ["budget"]
    if limits.budget is not None:
        try:
            Budget.parse(limits.budget)
        except (BadInputError, ValueError) as e:
            raise BadInputError(f"{file}: limits.budget: {e}") from e
    missing += [k for k in ("depth", "fanout") if getattr(limits, k) is None]
    return missing


def scan_home(definitions: Definitions, file: str, *, home: Path | None) -> list[Finding]:
    """:func:`scan`, with the bindings and the trifecta allow of ``home`` (if any)."""
    return scan(definitions, file, bindings=_home_bindings(home), allow=_home_allow(home))


def scan_paths(paths: list[Path], home: Path | None) -> tuple[int, list[str], list[Finding]]:
    """Agents checked, files read and findings of every ``*.toml`` under ``paths``."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.rglob("*.toml")) if path.is_dir() else [path]
    bindings, allow = _home_bindings(home), _home_allow(home)
    checked, findings = 0, []
    for file in files:
        definitions = load(file)
        checked += len(definitions.agent)
        findings += scan(definitions, str(file), bindings=bindings, allow=allow)
    return checked, [str(f) for f in files], findings


@click.command("scan")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--no-home", is_flag=True, help="Use no home's secret bindings or trifecta policy.")
@click.pass_obj
def scan_cmd(ctx: Ctx, paths: tuple[Path, ...], no_home: bool) -> None:
    """Lint agent definitions (TOML: docs/scan.md) for the lethal trifecta, secrets bound
    where their egress does not reach, and own-sandbox agents without limits; exit 4 on
    any finding. A directory is scanned for *.toml files."""
    home = None if no_home else charter_home()
    checked, files, findings = scan_paths(list(paths), home)
    doc: dict[str, Any] = {
        "ok": not findings,
        "checked": checked,
        "files": files,
        "findings": [f.to_json() for f in findings],
    }
    if ctx.as_json:
        click.echo(json.dumps(doc, sort_keys=True))
    else:
        for f in findings:
            click.echo(f"{f.file}: {f.agent}: {f.rule}: {f.detail}")
    if findings:
        click.echo(f"charter: error: {len(findings)} scan finding(s)", err=True)
        raise click.exceptions.Exit(4)
    if not ctx.as_json:
        click.echo(f"ok: {checked} agent(s) in {len(files)} file(s), no findings")
