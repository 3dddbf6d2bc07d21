"""Benchmark: the operator page in headless Chromium (Debian's ``/usr/bin/chromium``,
driven by playwright): its first render, its update latency (commit to DOM) and the
bytes each update sends, against the fabric's size.

    python3 bench/serve.py [--backend sqlite|postgres] [--pg URL] [--sizes 10,500]
        [--width 10] [--runs 20]

For each size (in one run, a journal of its own) the journal gets that many workers
first (fan-outs of at most 100 under the estate; minted and leased, no cell runs them),
so the page renders a tree of that size. Then:

- first render: a new page is opened and timed from navigation to the tree drawn
  (``body[data-position]`` set);
- update: a fan-out of ``--width`` is spawned and timed from just before the spawn to
  the last child's row in the DOM (so it includes the spawn's own commit); the same-run
  baseline is the spawn alone (returned, committed); the page's own time to draw the
  update (``render()`` or ``renderDelta()``, measured in the page) is shown apart;
- bytes per update: what a second viewer of ``/api/stream`` (a plain SSE client in the
  benchmark) received for the update (every event's data up to the new head), beside
  the size of the whole ``/api/fabric`` document at the end (what a stream that resends
  the fabric sends per update);
- CPU per update: the benchmark process's CPU time (the spawn, the server's fold, its
  answer, both viewers' streams) over the update runs, per run.

The script runs against whichever ``charter`` its own checkout holds: copy it into an
export of another commit (``git archive``) to measure that commit in the same session.
Prints p50/p90 of each (ms) and a summary line per size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

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
    parser.add_argument("--sizes", default="10,500", help="workers before the runs, each")
    parser.add_argument("--width", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    print(f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    summary = []
    for size in (int(s) for s in args.sizes.split(",")):
        summary.append(_size(size, args, sync_playwright))
    print("size  tree rows  commit->DOM p50  render p50  bytes/update p50  whole fabric  CPU/run")
    for line in summary:
        print(line)


def _size(size: int, args: argparse.Namespace, playwright: object) -> str:
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
                for i in range(0, size, 100):
                    _spawn(charter, min(100, size - i), f"preload {i}")
                fabric = Fabric(url)
                try:
                    return _measure(charter, fabric, args, playwright, size)
                finally:
                    fabric.close()


class _Viewer:
    """A second viewer of the stream on a thread: each event's position and bytes."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[int, int]] = []
        self.seen = threading.Condition()
        self.client = httpx.Client(timeout=None)
        self.thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self.thread.start()

    def _read(self, url: str) -> None:
        # (ends with an error when close() shuts the connection under it)
        with (
            contextlib.suppress(httpx.HTTPError, RuntimeError, ValueError, OSError),
            self.client.stream("GET", url) as stream,
        ):
            data = ""
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    data = line.partition(":")[2].removeprefix(" ")
                elif line == "" and data:
                    position = int(json.loads(data)["position"])
                    with self.seen:
                        self.events.append((position, len(data.encode())))
                        self.seen.notify_all()
                    data = ""

    def close(self) -> None:
        self.client.close()
        self.thread.join(timeout=5)

    def bytes_to(self, after: int, position: int) -> int:
        """The bytes of the events past ``after`` up to ``position`` (waits for it)."""
        with self.seen:
            if not self.seen.wait_for(
                lambda: bool(self.events) and self.events[-1][0] >= position, timeout=10
            ):
                raise RuntimeError(f"the viewer saw no event at {position}")
            return sum(n for p, n in self.events if after < p <= position)


def _measure(
    charter: Charter, fabric: Fabric, args: argparse.Namespace, playwright: object, size: int
) -> str:
    first: list[float] = []
    update: list[float] = []
    spawn: list[float] = []
    render: list[float] = []
    sent: list[float] = []
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
        viewer = _Viewer(url + "/api/stream")
        before = _head(charter)
        viewer.bytes_to(-1, before)
        cpu = time.process_time()
        for run in range(args.runs):
            started = time.monotonic()
            children = _spawn(charter, args.width, f"update {run}")
            spawned = time.monotonic()
            page.wait_for_selector(f'#tree tr[data-lineage="{children[-1]}"]', timeout=10_000)
            update.append(time.monotonic() - started)
            spawn.append(spawned - started)
            render.append(float(page.evaluate("document.body.dataset.renderMs")) / 1000)
            now = _head(charter)
            sent.append(viewer.bytes_to(before, now))
            before = now
        cpu = (time.process_time() - cpu) / args.runs
        rows = page.locator("#tree tbody tr").count()
        whole = len(httpx.get(url + "/api/fabric").content)
        viewer.close()
        browser.close()

    def ms(samples: list[float], q: float) -> str:
        return f"{percentile(samples, q) * 1000:7.1f}"

    print(f"backend {args.backend}, {size} workers first: tree of {rows} rows at the end")
    print(
        f"  first render     p50 {ms(first, 0.5)} ms  p90 {ms(first, 0.9)} ms  ({len(first)} runs)"
    )
    runs = f"({len(update)} runs, width {args.width})"
    print(f"  commit -> DOM    p50 {ms(update, 0.5)} ms  p90 {ms(update, 0.9)} ms  {runs}")
    print(f"  spawn alone      p50 {ms(spawn, 0.5)} ms  p90 {ms(spawn, 0.9)} ms")
    print(f"  page render      p50 {ms(render, 0.5)} ms  p90 {ms(render, 0.9)} ms  (in the page)")
    after = (percentile(update, 0.5) - percentile(spawn, 0.5)) * 1000
    print(f"  after the spawn returned: p50 {after:.1f} ms")
    print(
        f"  bytes per update p50 {percentile(sent, 0.5):9.0f}  p90 {percentile(sent, 0.9):9.0f}"
        f"  (the whole fabric at the end: {whole} bytes)"
    )
    print(f"  CPU per update   {cpu * 1000:7.1f} ms (this process: spawn, server, streams)")
    return (
        f"{size:>4}  {rows:>9}  {ms(update, 0.5)} ms  {ms(render, 0.5)} ms"
        f"  {percentile(sent, 0.5):>12.0f} B  {whole:>10} B  {cpu * 1000:7.1f} ms"
    )


def _head(charter: Charter) -> int:
    found = charter.journal.head()
    return 0 if found is None else found[0]


if __name__ == "__main__":
    main()
