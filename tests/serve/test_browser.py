"""The page in headless Chromium (Debian's ``chromium``, driven by playwright; no
browser is ever downloaded): the tree shows a fan-out's workers and a new commit
within 1 s (a delta: the rows it does not name are not redrawn), a gap in the deltas
brings a snapshot, the as-of slider shows an earlier state, hostile worker text stays
text (arriving in a delta), every request the page makes goes to 127.0.0.1, and a
screenshot is kept in
``tests/artifacts/serve/`` (gitignored; CI keeps it).

Where Chromium or playwright is missing, these tests skip with the reason, except in
CI (``CI`` or ``CHARTER_REQUIRE_POSTGRES=1``), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from charter.app import Charter
from charter.serve import Fabric
from tests.conftest import PG_REQUIRED
from tests.serve._support import HOSTILE, WIDE, fan_out, head, served

CHROMIUM = os.environ.get("CHARTER_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "serve"


def _missing() -> str | None:
    if shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM} (scripts/setup --dev installs Debian's chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = _missing()
    if missing is not None:
        if PG_REQUIRED:
            pytest.fail(missing + " (required in CI)", pytrace=False)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def _row(lineage: str) -> str:
    return f'#tree tr[data-lineage="{lineage}"]'


_POSITIONS = "items => items.map(i => i.dataset.position)"


def _count(page: Any, name: str) -> int:
    """One of the page's counters (``body[data-NAME]``): snapshots, deltas, gaps."""
    return int(page.evaluate(f"document.body.dataset.{name} || '0'"))


def test_the_page_in_chromium(estate: Charter, fabric: Fabric, browser: Any, backend: str) -> None:
    filler = fan_out(estate, 60, cost=WIDE)
    for lineage in filler:  # the list of 60 events is full: each new one drops the oldest
        estate.revoke(lineage, reason="fill the page's list of events")
    first = fan_out(estate, 4)
    between = head(estate)
    requests: list[str] = []
    with served(fabric) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.on("request", lambda request: requests.append(request.url))
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url + "/")
        # the tree shows the workers of the fan-out
        for child in first:
            page.wait_for_selector(_row(child), timeout=5_000)
        page.wait_for_selector('body[data-mode="live"]', timeout=5_000)
        assert page.locator("#tree tbody tr").count() == 1 + len(filler) + len(first)

        assert _count(page, "snapshots") == 1
        opened = page.eval_on_selector_all("#events li", _POSITIONS)
        assert len(opened) == 60
        # a row no update names keeps its element: only what changed is drawn again
        page.eval_on_selector(_row(first[0]), "row => { row.__kept = true; }")

        # a new commit reaches the DOM within 1 s (measured from before the spawn)
        started = time.monotonic()
        second = fan_out(estate, 3)
        committed = time.monotonic()
        page.wait_for_selector(_row(second[-1]), timeout=1_000)
        elapsed = time.monotonic() - started
        assert elapsed < 1.0, f"the tree showed the commit {elapsed:.3f} s after it"
        after = time.monotonic() - committed
        print(f"commit -> DOM: {elapsed * 1000:.0f} ms ({after * 1000:.0f} ms after the spawn)")
        assert _count(page, "snapshots") == 1  # it came as a delta
        assert _count(page, "deltas") >= 1
        assert page.eval_on_selector(_row(first[0]), "row => row.__kept === true")

        # hostile worker text is shown as text: no element made, no script run
        [target] = fan_out(estate, 1, objective=HOSTILE)
        estate.revoke(target, reason=HOSTILE)
        now = head(estate)
        page.wait_for_selector(f'body[data-position="{now}"]', timeout=2_000)
        assert page.locator(f'{_row(target)}[data-verdict="revoked"]').count() == 1
        hostile = page.locator("#events li", has_text="onerror")
        assert hostile.count() == 2  # the gate's verdict on its objective, the revoke's reason
        for shown in hostile.all_inner_texts():
            assert '<img src=x onerror="window.__pwned=1">' in shown
            assert "\\x1b[31mred" in shown
            assert "\x1b" not in shown
            assert "\u202e" not in shown
        assert page.locator("#events img, #tree img").count() == 0
        assert page.evaluate("window.__pwned") is None
        assert _count(page, "snapshots") == 1  # the hostile text came in deltas
        # drawn item by item, the list is the snapshot's: the new events in, the oldest out
        listed = page.eval_on_selector_all("#events li", _POSITIONS)
        assert listed == [
            str(e["position"]) for e in httpx.get(url + "/api/fabric").json()["events"]
        ]
        assert opened[-1] not in listed  # (the list was full: the oldest went)

        # a delta that is not from the state the page holds (a gap): a snapshot instead
        page.evaluate(
            "onDelta({data: JSON.stringify({base: -7, position: 10 ** 9, "
            "set: {position: 10 ** 9}, upsert: {}, drop: {}})})"
        )
        page.wait_for_selector('body[data-snapshots="2"]', timeout=3_000)
        assert _count(page, "gaps") == 1
        page.wait_for_selector(f'body[data-position="{now}"]', timeout=2_000)
        assert page.locator(_row(second[-1])).count() == 1

        # the as-of slider shows the earlier state
        page.eval_on_selector(
            "#asof",
            "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
            between,
        )
        page.wait_for_selector(f'body[data-position="{between}"]', timeout=3_000)
        assert page.locator('body[data-mode="past"]').count() == 1
        for child in first:
            assert page.locator(_row(child)).count() == 1
        for child in second:
            assert page.locator(_row(child)).count() == 0  # not there yet
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"as-of-{backend}.png"), full_page=True)

        # a commit while the page shows the past: its delta is kept, not shown
        deltas = _count(page, "deltas")
        third = fan_out(estate, 2)
        now = head(estate)
        page.wait_for_selector(f'body[data-latest="{now}"]', timeout=2_000)
        assert _count(page, "deltas") > deltas
        assert page.locator(f'body[data-position="{between}"]').count() == 1
        assert page.locator(_row(third[0])).count() == 0

        # and back to live: the kept state, the commit made meanwhile in it
        page.click("#live")
        page.wait_for_selector(f'body[data-position="{now}"]', timeout=3_000)
        page.wait_for_selector(_row(second[0]), timeout=1_000)
        page.wait_for_selector(_row(third[-1]), timeout=1_000)
        # the page's own application of every delta since its snapshot is the snapshot,
        # and the list shows its events, the dropped ones gone
        latest = httpx.get(url + "/api/fabric").json()
        assert page.evaluate("state.latest") == latest
        listed = page.eval_on_selector_all("#events li", _POSITIONS)
        assert listed == [str(e["position"]) for e in latest["events"]]
        assert len(listed) == 60
        shot = ARTIFACTS / f"page-{backend}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        # the control: markup parsed as HTML would have made an element the checks find
        page.evaluate(
            "html => document.getElementById('events').insertAdjacentHTML('beforeend', html)",
            f"<li>{HOSTILE}</li>",
        )
        assert page.locator("#events img").count() == 1
        context.close()
    assert errors == []
    assert requests, "the page made no request"
    hosts = {urlparse(u).hostname for u in requests}
    assert hosts == {"127.0.0.1"}, requests


# Each worker sleeps a moment (so the page sees it run), then prints hostile text: its
# stdout is its result, journaled as WorkerResult and listed by the page.
_PRINT = 'sleep 1; printf "<img src=x onerror=window.__pwned=1> \\033[31mred"'


@pytest.mark.sandbox
@pytest.mark.usefixtures("_no_load")
def test_a_running_fan_out_in_chromium(
    estate: Charter, fabric: Fabric, browser: Any, backend: str, state_dir: Path
) -> None:
    from charter.authority import SpawnIntent
    from charter.control import WorkerSpec
    from tests.runner._support import make_cell, running
    from tests.serve._support import COST

    spec = WorkerSpec(argv=("/bin/sh", "-c", _PRINT))
    requests: list[str] = []
    with running(make_cell(estate, None, state_dir)), served(fabric) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.on("request", lambda request: requests.append(request.url))
        page = context.new_page()
        page.goto(url + "/")
        page.wait_for_selector('body[data-mode="live"]', timeout=5_000)
        intent = SpawnIntent(
            width=2, objective="two workers the page watches run and end", estimated_cost=COST
        )
        children = [
            str(c.lineage) for c in estate.spawn("agent:estate", intent, workers=(spec,)).children
        ]
        for child in children:  # scheduled, then running, then exited
            page.wait_for_selector(_row(child), timeout=2_000)
        live = ", ".join(f'{_row(c)}[data-status="running"]' for c in children)
        page.wait_for_selector(live, timeout=20_000)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"running-{backend}.png"), full_page=True)
        for child in children:
            page.wait_for_selector(f'{_row(child)}[data-status="exited"]', timeout=30_000)
        results = page.locator("#events li", has_text="WorkerResult")
        results.first.wait_for(timeout=5_000)
        shown = results.first.inner_text()
        assert "<img src=x onerror=window.__pwned=1>" in shown
        assert "\\x1b[31mred" in shown
        assert page.locator("#events img").count() == 0
        assert page.evaluate("window.__pwned") is None
        page.screenshot(path=str(ARTIFACTS / f"ended-{backend}.png"), full_page=True)
        context.close()
    assert {urlparse(u).hostname for u in requests} == {"127.0.0.1"}, requests
