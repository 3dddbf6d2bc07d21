"""The real OpenAI Python SDK (``openai``, the dev extra) inside a real sandbox, its
``base_url`` the model door (``/run/charter/model.sock``): chat completions and the
Responses shape, streamed and not, and the tokens charged to the worker's lease are
the usage the loopback server reported, which is also what the SDK read.

The sandbox sees the host's ``/usr`` only, so the SDK and its dependencies (pure Python
and CPython 3.11 extensions, as Debian's python3 runs) are put in the cell's workspace
template (``Charter.cell(template=…)``), under ``/workspace/site``."""

from __future__ import annotations

import os
import re
import shutil
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

from charter.app import Charter
from charter.budgets import UsageRecorded
from charter.runner.cell import Cell
from charter.runner.events import ModelCallSettled, WorkerEnded
from charter.runner.model import ModelEndpoint
from tests.runner._model_server import Behaviour, model_server
from tests.runner._support import running, until_idle
from tests.runner.conftest import initialise
from tests.runner.test_model_door import (
    API_KEY,
    clean,
    model_cell,
    of_type,
    one_caller,
    results,
)

CLIENT = Path(__file__).resolve().parents[2] / "charter" / "runner" / "client.py"

SDK_CALLER = """
import sys, json
sys.path[:0] = ["/workspace", "/workspace/site"]
import charter_door, httpx2, openai

client = openai.OpenAI(
    base_url="http://charter/v1",
    api_key="held-by-charter",  # any string: the door adds the real key
    max_retries=0,
    http_client=httpx2.Client(transport=httpx2.HTTPTransport(uds=charter_door.MODEL_PATH)),
)
messages = [{"role": "user", "content": "one two three"}]
out = {"version": openai.__version__}
whole = client.chat.completions.create(model="test-model", max_tokens=5, messages=messages)
out["chat"] = [whole.usage.prompt_tokens, whole.usage.completion_tokens]
out["chat_text"] = whole.choices[0].message.content
chunks = list(client.chat.completions.create(
    model="test-model", max_tokens=6, messages=messages, stream=True,
    stream_options={"include_usage": True}))
out["chat_stream"] = [[c.usage.prompt_tokens, c.usage.completion_tokens] for c in chunks if c.usage]
out["chat_stream_content"] = sum(1 for c in chunks for x in c.choices if x.delta.content)
answer = client.responses.create(model="test-model", input="four five", max_output_tokens=4)
out["responses"] = [answer.usage.input_tokens, answer.usage.output_tokens]
out["responses_text"] = answer.output_text
events = list(client.responses.create(
    model="test-model", input=[{"role": "user", "content": "six"}], max_output_tokens=3,
    stream=True))
out["responses_stream"] = [[e.response.usage.input_tokens, e.response.usage.output_tokens]
                           for e in events if e.type == "response.completed"]
out["responses_deltas"] = sum(1 for e in events if e.type == "response.output_text.delta")
charter_door.Door().result(json.dumps(out))
"""


def _sdk_modules() -> list[Path]:
    """The top-level files and packages of site-packages of the SDK's distribution and
    every one it requires (its metadata too: the SDK reads versions from it), as this
    interpreter has them installed."""
    site = Path(sysconfig.get_paths()["purelib"])
    seen: set[str] = set()
    todo = ["openai"]
    tops: set[Path] = set()
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional requirement not installed
        for required in dist.requires or ():
            if "extra ==" not in required:
                todo.append(re.split(r"[ ;<>=!~\[(]", required, maxsplit=1)[0])
        for f in dist.files or ():
            top = f.parts[0]
            if top != ".." and (site / top).exists():
                tops.add(site / top)
    return sorted(tops)


@pytest.fixture(scope="module")
def sdk_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace template: the door's client and the SDK (hard links where they can
    be: the template is read-only under every worker's overlay)."""
    template = tmp_path_factory.mktemp("sdk-template")
    shutil.copyfile(CLIENT, template / "charter_door.py")
    site = template / "site"
    site.mkdir()

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    for top in _sdk_modules():
        if top.is_dir():
            shutil.copytree(top, site / top.name, copy_function=link)
        else:
            link(str(top), str(site / top.name))
    for path in [template, *template.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert (site / "openai").is_dir()
    return template


def _cell(charter: Charter, state_dir: Path, endpoint: ModelEndpoint, template: Path) -> Cell:
    cell = model_cell(charter, state_dir, endpoint)
    cell.template = template
    return cell


def test_the_openai_sdk_through_the_door_is_charged_the_servers_usage(
    journal_url: str, tmp_path: Path, state_dir: Path, sdk_template: Path
) -> None:
    with (
        model_server(Behaviour(length=7)) as (url, server),
        initialise(journal_url, tmp_path / "home") as charter,
    ):
        worker = one_caller(charter, 10_000, SDK_CALLER)
        with running(_cell(charter, state_dir, ModelEndpoint(url, API_KEY), sdk_template)) as c:
            until_idle(c)
        said = results(charter).get(worker)
        assert said is not None, of_type(charter, WorkerEnded)
        assert isinstance(said, dict)
        # What the SDK read is what the server reported, call by call.
        reported = [list(r) for r in server.reported]
        assert reported == [[6, 5], [6, 6], [5, 4], [4, 3]]
        assert said["chat"] == reported[0]
        assert said["chat_text"] == "tok " * 5
        assert said["chat_stream"] == [reported[1]]
        assert said["chat_stream_content"] == 6
        assert said["responses"] == reported[2]
        assert said["responses_text"] == "tok " * 4
        assert said["responses_stream"] == [reported[3]]
        assert said["responses_deltas"] == 3
        # The key the server saw is Charter's, never the SDK's placeholder.
        assert server.auth == [f"Bearer {API_KEY}"] * 4
        # And what the journal charged is the same: exactly, call by call.
        by_call = {s.call: s for s in of_type(charter, ModelCallSettled)}
        settled = [by_call[r.call] for r in of_type(charter, ModelCallSettled)]
        assert [[s.prompt_tokens, s.completion_tokens] for s in settled] == reported
        assert all(s.how == "usage" and not s.estimated for s in settled)
        usage = [u for u in of_type(charter, UsageRecorded) if u.lineage == worker]
        assert sum(u.amount.tokens for u in usage) == sum(p + c for p, c in reported)
        clean(charter)
