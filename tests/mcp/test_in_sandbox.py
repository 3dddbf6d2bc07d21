"""``charter mcp`` inside a worker's sandbox: the worker runs an official-SDK MCP client,
which starts ``charter mcp`` as its stdio subprocess; the server finds the door at
``/run/charter/keys.sock`` and serves the worker as the door identifies it (by the
kernel), never as anything the arguments say.

The sandbox sees only the host's ``/usr``: the SDK, its dependencies and this checkout
are put in the worker's workspace template (``/workspace/lib``), read-only under its
overlay, as an operator would install them into the image a cell's sandboxes see.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import shutil
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from charter.authority import FixedPolicy, GrantMinted, SpawnIntent, Verdict
from charter.core import Budget
from charter.runner.events import WorkerEnded, WorkerResult
from tests.mcp._support import INTENT
from tests.runner._support import ROOT_DIR, make_cell, running, until_idle
from tests.runner.conftest import initialise
from tests.runner.programs import PY, python

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def _closure(name: str, extras: tuple[str, ...], seen: dict[str, metadata.Distribution]) -> None:
    key = name.lower().replace("_", "-")
    if key in seen:
        return
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return
    seen[key] = dist
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            _closure(req.name, tuple(req.extras), seen)


@pytest.fixture(scope="session")
def sdk_template(state_dir: Path) -> Path:
    """A workspace template holding the door's client, this checkout's ``charter`` and
    every distribution ``charter[mcp]`` needs, all readable by the sandbox's uid."""
    path = state_dir / "mcp-template"
    lib = path / "lib"
    lib.mkdir(parents=True)
    seen: dict[str, metadata.Distribution] = {}
    _closure("charter", ("mcp",), seen)
    _closure("mcp", (), seen)  # an editable install's metadata may predate the extra
    for key, dist in seen.items():
        if key == "charter":
            continue
        tops = {str(f).split("/")[0] for f in dist.files or []}
        for top in tops - {".."}:
            if top == "__pycache__":  # its .dist-info too: the SDK reads its metadata
                continue
            source = Path(str(dist.locate_file(top)))
            if source.is_dir():
                shutil.copytree(source, lib / top, ignore=_IGNORE, dirs_exist_ok=True)
            elif source.is_file():
                shutil.copy2(source, lib / top)
    shutil.copytree(ROOT_DIR / "charter", lib / "charter", ignore=_IGNORE)
    shutil.copy2(ROOT_DIR / "charter" / "runner" / "client.py", path / "charter_door.py")
    for item in [path, *path.rglob("*")]:
        item.chmod(0o755 if item.is_dir() else 0o644 | (item.stat().st_mode & 0o111))
    return path


SERVER = (
    "import sys; sys.path.insert(0, '/workspace/lib'); from charter.cli import main; "
    "main(['mcp', '--worker', '{\"argv\": [\"/bin/echo\", \"a grandchild\"]}'])"
)

CLIENT = f"""
import json, sys
sys.path.insert(0, '/workspace'); sys.path.insert(0, '/workspace/lib')
import anyio, charter_door
from mcp import Client, StdioServerParameters

INTENT = {json.dumps(INTENT)}
params = StdioServerParameters(command="{PY}", args=["-I", "-B", "-c", {SERVER!r}])
out = {{}}

async def main():
    async with Client(params) as client:
        out["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        me = (await client.call_tool("whoami", {{}})).structured_content
        out["whoami"] = [me["lineage"], me["face"]]
        named = await client.call_tool("spawn", dict(INTENT, parent="agent:estate"))
        out["identity"] = named.structured_content["reason"]
        spawned = await client.call_tool("spawn", INTENT)
        out["spawned"] = not spawned.is_error
        kids = spawned.structured_content["children"]
        out["kids"] = kids
        out["positions"] = [me["position"], spawned.structured_content["position"]]
        for _ in range(60):
            waited = (await client.call_tool("wait", {{"children": kids, "timeout_s": 2}}))
            answer = waited.structured_content
            if answer["complete"]:
                break
        out["done"] = {{k: [v["status"], v["result"]] for k, v in answer["done"].items()}}
        out["positions"].append(answer["position"])
        budget = await client.call_tool("budget", {{}})
        out["budget"] = budget.structured_content["reason"]

anyio.run(main)
charter_door.Door().result(json.dumps(out))
"""

SLOT = Budget.parse("tokens=0,wall=120s,cpu=120s,mem=1GiB,egress=0MB")
# The worker's lease: room for its own two children (the sandbox minimum each) well
# inside what the default gate lets one fan-out take of it.
COST = Budget.parse("tokens=200k,wall=10m,cpu=10m,mem=4GiB,egress=0MB")


def test_inside_a_sandbox_the_client_is_the_worker_its_door_names(
    sqlite_url: str, tmp_path: Path, state_dir: Path, sdk_template: Path
) -> None:
    with initialise(sqlite_url, tmp_path / "home", processing=2, coordination=2) as charter:
        intent = SpawnIntent.model_validate(
            {"width": 1, "objective": "an MCP client fans out through its door",
             "estimated_cost": COST, "grant": {"fanout": 2, "depth": 2}}
        )  # fmt: skip
        result = charter.spawn(
            "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE),
            workers=(python(CLIENT),),
        )  # fmt: skip
        (worker,) = (str(c.lineage) for c in result.children)
        cell = make_cell(charter, sdk_template, state_dir, door=True, budget=SLOT)
        with running(cell):
            until_idle(cell, timeout=300)
        entries = list(charter.journal.entries())
        ended = {e.event.lineage: e.event for e in entries if isinstance(e.event, WorkerEnded)}
        results = {
            e.event.lineage: e.event.text for e in entries if isinstance(e.event, WorkerResult)
        }
        assert ended[worker].exit_code == 0, (ended[worker], results.get(worker))
        out = json.loads(results[worker])
        assert out["tools"] == sorted(["spawn", "wait", "budget", "subtree", "revoke", "whoami"])
        assert out["whoami"] == [worker, "worker"]  # the door's word, not the client's
        assert out["identity"] == "identity-in-arguments"
        assert out["spawned"] is True  # the control: the same intent without it
        assert all(k.startswith(worker + "/") for k in out["kids"])
        assert len(out["kids"]) == 2
        for kid in out["kids"]:
            status, text = out["done"][kid]
            assert status == "exited"
            assert "a grandchild" in text
            assert ended[kid].exit_code == 0
        assert out["budget"] == "not-through-door"
        # The spawn's position is its commit's (the children's grants at or before it),
        # the answered wait's at or after every child's end; the door reports none for
        # whoami.
        whoami_at, spawned_at, waited_at = out["positions"]
        assert whoami_at is None
        assert spawned_at < waited_at
        minted = {
            str(e.event.lineage): e.position for e in entries if isinstance(e.event, GrantMinted)
        }
        assert all(minted[kid] <= spawned_at for kid in out["kids"])
        end_at = {e.event.lineage: e.position for e in entries if isinstance(e.event, WorkerEnded)}
        assert all(end_at[kid] <= waited_at for kid in out["kids"])
