"""docs/architecture.md as a checked contract: its event table against the event
registry, its dependency list against the import graph (grimp, as import-linter builds
it), its contract list against pyproject's [tool.importlinter], and its layer column
against the layers contract. A failure prints what the page should say."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections import defaultdict

import grimp

from tests.docs import ROOT

PAGE = ROOT / "docs" / "architecture.md"


def _section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _table_rows(section: str) -> list[list[str]]:
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("|")
    ]
    return rows[2:]  # the header and its rule


# -- events ------------------------------------------------------------------------


def _documented_events() -> dict[str, set[str]]:
    where: dict[str, set[str]] = defaultdict(set)
    module = ""
    for row in _table_rows(_section("Where events live")):
        if row[0]:
            path = re.fullmatch(r"`(charter/[\w/]+)\.py`", row[0])
            assert path, row
            module = path.group(1).replace("/", ".")
        names = re.findall(r"`([A-Z]\w+)`", row[1])
        assert names, row
        for name in names:
            assert all(name not in types for types in where.values()), f"{name} listed twice"
            where[module].add(name)
    return dict(where)


_REGISTRY_PROBE = """
import importlib, json, pkgutil, charter
from charter.core.events import event_types
import charter.catalogue
catalogue = sorted(event_types())
for info in pkgutil.walk_packages(charter.__path__, "charter."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
from charter.core.events import Event
print(json.dumps({
    "catalogue": catalogue,
    "all": {name: cls.__module__ for name, cls in event_types().items()},
    "standalone": sorted(n for n, c in event_types().items() if c.stream is Event.stream),
}))
"""


def _registry() -> tuple[list[str], dict[str, str], list[str]]:
    """In a fresh interpreter: what the catalogue alone registers, every type registered
    once every module of charter is imported with its module, and the standalone ones
    (no stream of their own)."""
    done = subprocess.run(
        [sys.executable, "-c", _REGISTRY_PROBE], capture_output=True, text=True, check=True,
        cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120,
    )  # fmt: skip
    found = json.loads(done.stdout)
    return found["catalogue"], found["all"], found["standalone"]


def test_the_event_table_is_the_registry() -> None:
    catalogue, registered, _ = _registry()
    assert len(registered) >= 30  # control: the walk does register the event types
    actual: dict[str, set[str]] = defaultdict(set)
    for name, module in registered.items():
        actual[module].add(name)
    expected_rows = "\n".join(
        f"| `{module.replace('.', '/')}.py` | "
        + ", ".join(f"`{n}`" for n in sorted(names))
        + " | … |"
        for module, names in sorted(actual.items())
    )
    assert _documented_events() == dict(actual), (
        "docs/architecture.md's event table is not the registry; it should list:\n" + expected_rows
    )
    assert sorted(catalogue) == sorted(registered), "charter/catalogue.py misses a module"


def test_the_standalone_events_are_the_ones_without_a_stream() -> None:
    _, _, standalone = _registry()
    documented = {
        name
        for row in _table_rows(_section("Where events live"))
        if row[2] == "standalone"
        for name in re.findall(r"`([A-Z]\w+)`", row[1])
    }
    assert "JournalCreated" in documented  # control: the column is read
    assert documented == set(standalone)


# -- dependencies -------------------------------------------------------------------

_ARROW = "──►"


def _documented_dependencies() -> tuple[dict[str, set[str]], dict[tuple[str, str], set[str]]]:
    block = _section("Dependency direction").split("```")[1]
    deps: dict[str, set[str]] = {}
    via: dict[tuple[str, str], set[str]] = {}
    for line in block.splitlines():
        if _ARROW not in line:
            continue
        left, right = (part.strip() for part in line.split(_ARROW))
        listed, _, note = right.partition("  ")
        imported = set() if listed == "nothing in charter" else {
            name.strip() for name in listed.split(",")
        }  # fmt: skip
        for package in (name.strip() for name in left.split(",")):
            assert package not in deps, f"{package} has two lines"
            deps[package] = imported
            for target, files in re.findall(r"(\w+) via ([\w., ]+?)[;)]", note):
                via[(package, target)] = {f.strip().removesuffix(".py") for f in files.split(",")}
    return deps, via


def _import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], set[str]]]:
    graph = grimp.build_graph("charter")
    deps: dict[str, set[str]] = defaultdict(set)
    who: dict[tuple[str, str], set[str]] = defaultdict(set)
    for module in graph.modules:
        parts = module.split(".")
        if len(parts) < 2 or parts[1] == "__main__":  # the root and `python -m charter`
            continue
        deps[parts[1]]  # a package that imports nothing of charter has a line too
        for imported in graph.find_modules_directly_imported_by(module):
            target = imported.split(".")
            if len(target) > 1 and target[1] != parts[1]:
                deps[parts[1]].add(target[1])
                who[(parts[1], target[1])].add(".".join(parts[2:]) or "__init__")
    return dict(deps), dict(who)


def test_the_dependency_list_is_the_import_graph() -> None:
    documented, via = _documented_dependencies()
    actual, who = _import_graph()
    assert {"cli", "core", "ledger"} <= set(actual)  # control: the graph is charter's
    expected = "\n".join(f"{p} ──► {', '.join(sorted(d)) or 'nothing in charter'}"
                         for p, d in sorted(actual.items()))  # fmt: skip
    assert documented == actual, "docs/architecture.md should say:\n" + expected
    assert via, "control: the page names which modules import the ledger"
    for (package, target), files in via.items():
        assert files == who[(package, target)], (package, target, sorted(who[(package, target)]))


# -- contracts and layers ---------------------------------------------------------------

_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def test_the_contract_list_is_pyprojects() -> None:
    section = _section("Dependency direction")
    contracts = _contracts()
    count = re.search(r"declares (\w+) import-linter contracts", section)
    assert count, "the page says how many contracts there are"
    assert count.group(1) == _NUMBERS[len(contracts)]
    listed = re.findall(r"^(\d+)\. \*\*(.+?)\*\*\s*\(`(\w+)`", section, re.MULTILINE | re.DOTALL)
    assert [(int(n), " ".join(name.split()), kind) for n, name, kind in listed] == [
        # a trailing "(…)" of the name (where it is documented) need not be repeated
        (i, re.sub(r" \([^)]*\)$", "", str(c["name"])), str(c["type"]))
        for i, c in enumerate(contracts, 1)
    ]


def test_the_layer_order_and_column_are_the_layers_contract() -> None:
    (layers,) = [c["layers"] for c in _contracts() if c["type"] == "layers"]
    assert isinstance(layers, list)
    names = [[m.strip().removeprefix("charter.") for m in str(lay).split("|")] for lay in layers]
    spelled = " > ".join("`" + " | ".join(group) + "`" for group in names)
    section = " ".join(_section("Dependency direction").split())
    assert spelled in section, spelled
    level = {pkg: f"L{len(names) - 1 - i}" for i, group in enumerate(names) for pkg in group}
    for row in _table_rows(_section("Packages and layers")):
        path = re.fullmatch(r"`charter/(\w+)(?:/|\.py)`", row[0])
        assert path, row
        assert row[1] == level[path.group(1)], (row[0], row[1], level[path.group(1)])
