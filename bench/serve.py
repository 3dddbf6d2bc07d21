"""Benchmark: the operator page in headless Chromium (Debian's ``/usr/bin/chromium``,
driven by playwright): its first render and its update latency, commit to DOM.

    python3 bench/serve.py [--backend sqlite|postgres] [--pg URL] [--preload 300]
        [--width 10] [--runs 20]

The journal gets ``--preload`` workers first (fan-outs of 100 under the estate; minted
and leased, no cell runs them), so the page renders a tree of that size. Then:

- first render: a new page is opened and timed from navigation to the tree drawn
  (``body[data-position]`` set);
- update: a fan-out of ``--width`` is spawned and timed from just before the spawn to
  the last child's row in the DOM (so it includes the spawn's own commit); the same-run
  baseline is the spawn alone (returned, committed), and the ratio is update / spawn;
  the page's own time to draw the update (``render()``, measured in the page) is shown
  apart from the rest (the server's fold and the event's trip).

Prints p50/p90 of each (ms).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._support import percentile, scratch_database
from charter.app import CellSetup, Charter, Settings
from charter.authority import SpawnIntent
from charter.budgets import FabricCeilings
from charter.control import Ceiling
from charter.core import Budget, KeyStore
from charter.serve import Fabric
from tests.serve._support import served

CEILING = Budget.parse("tokens=1000000M,wall=100000h,cpu=100000h,mem=100000GiB,egress=100GB")


def _cost(width: int) -> Budget:
    """Enough per worker for the default gate (cost-benefit) to say yes."""
    return Budget(
        tokens=10_000 * width, wall_ms=60_000 * width, cpu_ms=60_000 * width,
        mem_bytes=(1 << 28) * width, egress_bytes=0,
    )  # fmt: skip


@contextlib.contextmanager
def _journal(backend: str, pg: str, scratch: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{scratch / 'journal.db'}"
    else:
        with scratch_database(pg) as url:
            yield url


def _spawn(charter: Charter, width: int, label: str) -> list[str]:
    intent = SpawnIntent(
        width=width, objective=f"benchmark the page: {label}", estimated_cost=_cost(width)
    )
    return [str(c.lineage) for c in charter.spawn("agent:estate", intent).children]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--preload", type=int, default=300)
    parser.add_argument("--width", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="charter-bench-serve-") as tmp:
        scratch = Path(tmp)
        home = scratch / "home"
        os.environ["CHARTER_HOME"] = str(home)
        settings = Settings(ceilings=FabricCeilings(population=10**9, depth=32))
        with _journal(args.backend, args.pg, scratch) as url:
            charter, _ = Charter.initialise(
                url, root="estate", ceiling=Ceiling(budget=CEILING, depth=8, fanout=1000),
                cell=CellSetup(cores=2), keys=KeyStore(home), settings=settings,
            )  # fmt: skip
            with charter:
                for i in range(0, args.preload, 100):
                    _spawn(charter, min(100, args.preload - i), f"preload {i}")
                fabric = Fabric(url)
                try:
                    _measure(charter, fabric, args, sync_playwright)
                finally:
                    fabric.close()


def _measure(
    charter: Charter, fabric: Fabric, args: argparse.Namespace, playwright: object
) -> None:
    first: list[float] = []
    update: list[float] = []
    spawn: list[float] = []
    render: list[float] = []
    with served(fabric) as url, playwright() as p:  # type: ignore[operator]
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"]
        )
        for _ in range(min(args.runs, 10)):
            page = browser.new_page()
            started = time.monotonic()
            page.goto(url + "/")
            page.wait_for_selector("body[data-position]", timeout=10_000)
            first.append(time.monotonic() - started)
            page.close()
        page = browser.new_page()
        page.goto(url + "/")
        page.wait_for_selector('body[data-mode="live"]', timeout=10_000)
        for run in range(args.runs):
            started = time.monotonic()
            children = _spawn(charter, args.width, f"update {run}")
            spawned = time.monotonic()
            page.wait_for_selector(f'#tree tr[data-lineage="{children[-1]}"]', timeout=10_000)
            update.append(time.monotonic() - started)
            spawn.append(spawned - started)
            render.append(float(page.evaluate("document.body.dataset.renderMs")) / 1000)
        rows = page.locator("#tree tbody tr").count()
        browser.close()

    def ms(samples: list[float], q: float) -> str:
        return f"{percentile(samples, q) * 1000:7.1f}"

    print(f"backend {args.backend}: tree of {rows} rows at the end, {os.cpu_count()} cores")
    print(
        f"  first render     p50 {ms(first, 0.5)} ms  p90 {ms(first, 0.9)} ms  ({len(first)} runs)"
    )
    runs = f"({len(update)} runs, width {args.width})"
    print(f"  commit -> DOM    p50 {ms(update, 0.5)} ms  p90 {ms(update, 0.9)} ms  {runs}")
    print(f"  spawn alone      p50 {ms(spawn, 0.5)} ms  p90 {ms(spawn, 0.9)} ms")
    print(f"  page render      p50 {ms(render, 0.5)} ms  p90 {ms(render, 0.9)} ms  (in the page)")
    ratio = percentile(update, 0.5) / max(percentile(spawn, 0.5), 1e-9)
    print(f"  ratio update / spawn (p50): {ratio:.2f}")
    after = (percentile(update, 0.5) - percentile(spawn, 0.5)) * 1000
    print(f"  after the spawn returned: p50 {after:.1f} ms")


if __name__ == "__main__":
    main()
