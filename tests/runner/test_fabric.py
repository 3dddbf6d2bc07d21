"""Many cells on one PostgreSQL journal (docs/fabric.md): three ``charter cell run``
processes run a 300-worker two-level fan-out (12 coordinators, each fanning out 24
leaves through its door, placed across the cells); one cell is SIGKILLed in the
middle. Its started workers are failed (``lost``) and their parents told within the
liveness period, its leases and slots return, its workers that had not started move
to the other two, which finish the rest; no worker runs twice (counted in the journal
and in each worker's own stdout log, which the cell appends to on the host);
``charter audit`` is clean, ``charter journal verify`` passes and the independent folds
hold."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from charter.app import CellSetup, Charter, Settings
from charter.authority import FixedPolicy, SpawnIntent, Verdict
from charter.control import Ceiling, ResourceView, WorkerScheduled, WorkerSpec
from charter.core import Budget, KeyStore, now_ms
from charter.runner._logs import log_dir
from charter.runner.events import CellStarted, WorkerEnded, WorkerStarted
from tests.invariants import check_history, check_settled, check_workers, journal_history
from tests.runner._support import cli_env
from tests.runner.programs import PRELUDE, PY, WORKED

pytestmark = [pytest.mark.slow, pytest.mark.sandbox, pytest.mark.postgres]

CELLS = ("c1", "c2", "c3")
VICTIM = "c2"
CLAIM_S = 6.0  # the liveness period: a cell that stops renewing is gone this long after
COORDINATORS = 12
LEAVES = 24  # 12 x 24 = 288 leaves + 12 coordinators = 300 workers
ROOT = Budget.parse("tokens=10M,wall=100h,cpu=10h,mem=64GiB,egress=1GB")
# A coordinator waits for its leaves the whole run: its sandbox may live ten minutes.
SLOT = "tokens=0,wall=10m,cpu=10m,mem=256MiB,egress=0MB"
# A lease's wall clock runs from its fan-out: ten minutes, so a leaf queued behind the
# others (or moved off the killed cell) still has time left when it starts.
LEAF_COST = {"wall_ms": 600_000, "cpu_ms": 20_000, "mem_bytes": 64 << 20, "egress_bytes": 0}

# Says it ran (its stdout log on the host is the side file), fans out LEAVES children
# that echo their number, waits for them all, and answers with how each ended.
FANNER = (
    PRELUDE
    + WORKED
    + f"""
print("ran", flush=True)
width = int(sys.argv[1])
cost = {{k: v * width for k, v in {LEAF_COST!r}.items()}}
kids = worked(lambda d: d.spawn({{"width": width, "objective": "echo numbers",
                   "estimated_cost": {{"tokens": 10_000 * width, **cost}}}},
                  [{{"argv": ["/bin/sh", "-c", "echo ran; sleep 1"]}}
                   for i in range(width)]))["children"]
answers = worked(lambda d: d.wait(kids, 150))["children"]
worked(lambda d: d.result(json.dumps(sorted(answers[k]["status"] for k in kids))))
"""
)


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]  # the tests stub os.getloadavg


def _cell(
    url: str,
    home: Path,
    state_dir: Path,
    cell: str,
    *options: str,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``charter cell run --id CELL OPTIONS...``, with ``env`` added to a test's environment."""
    return subprocess.Popen(
        [sys.executable, "-m", "charter", "--db", url, "--quiet", "cell", "run", "--id", cell,
         "--claim", str(CLAIM_S), "--ignore-host-load", "--slot-budget", SLOT, *options],
        env=cli_env(home, state_dir) | (env or {}), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def _cli(url: str, home: Path, state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "charter", "--db", url, *args],
        env=cli_env(home, state_dir), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _wait(what: str, done: object, within: float, cells: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + within
    while not done():  # type: ignore[operator]
        for p in cells:
            if p.poll() is not None and p.returncode not in (None, -signal.SIGKILL):
                err = p.stderr.read().decode() if p.stderr else ""
                pytest.fail(f"a cell exited {p.returncode} while waiting for {what}: {err[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def _fabric(
    url: str, home: Path, ceiling: Ceiling, setup: CellSetup, cells: tuple[str, ...]
) -> None:
    """A fresh Charter on ``url`` (root ``estate`` under ``ceiling``), each of ``cells``
    configured with ``setup``."""
    charter, _ = Charter.initialise(
        url, root="estate", ceiling=ceiling, cell=setup, keys=KeyStore(home), settings=Settings()
    )
    with charter:
        for name in cells:
            charter.configure_cell(setup, name)


def test_three_cells_one_sigkilled_finish_a_300_worker_fan_out(
    pg_url: str, tmp_path: Path, state_dir: Path
) -> None:
    home = tmp_path / "home"
    # 4 cores less 2 live peers on this host: a cap of 2 each
    _fabric(
        pg_url,
        home,
        Ceiling(budget=ROOT, depth=4, fanout=400),
        CellSetup(cores=4, processing=4, coordination=64),
        CELLS,
    )
    procs = {name: _cell(pg_url, home, state_dir, name) for name in CELLS}
    try:
        _run(pg_url, home, state_dir, procs)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def _run(url: str, home: Path, state_dir: Path, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    live = list(procs.values())
    with Charter.open(url, keys=KeyStore(home)) as charter:
        journal = charter.journal

        read: list = []

        def entries() -> list:
            """The journal so far (read on from the last entry read)."""
            read.extend(journal.entries(start=read[-1].position + 1 if read else None))
            return read

        def started_cells() -> bool:
            return {e.event.cell for e in entries() if isinstance(e.event, CellStarted)} >= set(
                CELLS
            )

        _wait("three cells to start", started_cells, 60, live)
        intent = SpawnIntent.model_validate(
            {
                "width": COORDINATORS,
                "objective": "fan out and gather",
                "estimated_cost": Budget.parse("tokens=4M,wall=60h,cpu=2h,mem=32GiB,egress=0MB"),
                "grant": {"fanout": LEAVES, "depth": 2},
            }
        )
        spec = WorkerSpec(argv=(PY, "-I", "-c", FANNER), inputs=(str(LEAVES),))
        charter.spawn("agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=(spec,))

        def ended() -> int:
            return sum(isinstance(e.event, WorkerEnded) for e in entries())

        def victim_runs_a_leaf_of_a_peers_coordinator() -> bool:
            """A third of the workers done, and the victim runs a leaf whose parent runs
            on another cell (so a parent on a live cell must be told it was lost)."""
            history = entries()
            if sum(isinstance(e.event, WorkerEnded) for e in history) < 100:
                return False
            cell = {e.event.lineage: e.event.cell for e in history
                    if isinstance(e.event, WorkerScheduled)}  # fmt: skip
            done = {e.event.lineage for e in history if isinstance(e.event, WorkerEnded)}
            return any(
                isinstance(e.event, WorkerStarted)
                and e.event.cell == VICTIM
                and e.event.lineage.count("/") == 2
                and e.event.lineage not in done
                and cell[e.event.lineage.rpartition("/")[0]] != VICTIM
                for e in history
            )

        # SIGKILL the victim in the middle, while it runs a leaf of a peer's coordinator.
        _wait("the middle of the run", victim_runs_a_leaf_of_a_peers_coordinator, 150, live)
        procs[VICTIM].send_signal(signal.SIGKILL)
        killed_ms = now_ms()
        procs[VICTIM].wait()
        at_kill = list(entries())
        total = COORDINATORS * (LEAVES + 1)

        def all_ended() -> bool:
            history = entries()
            scheduled = {e.event.lineage for e in history if isinstance(e.event, WorkerScheduled)}
            done = {e.event.lineage for e in history if isinstance(e.event, WorkerEnded)}
            return len(scheduled) == total and scheduled <= done

        _wait("every worker to end", all_ended, 150, [procs[c] for c in CELLS if c != VICTIM])
        for name in CELLS:  # the survivors drain (nothing runs) and stop
            if name != VICTIM:
                procs[name].send_signal(signal.SIGTERM)
        for name in CELLS:
            if name != VICTIM:
                procs[name].wait(timeout=60)
                assert procs[name].returncode == 0, procs[name].stderr.read().decode()[-2000:]
        history = entries()
        payloads = journal_history(journal)

    # What the victim held at the kill: started workers not ended, and workers placed on
    # it that had not started (both must be there, or the test shows nothing).
    placed: dict[str, str] = {}
    started_at_kill: set[str] = set()
    ended_at_kill: set[str] = set()
    for e in at_kill:
        if isinstance(e.event, WorkerScheduled):
            placed[e.event.lineage] = e.event.cell
        elif isinstance(e.event, WorkerStarted):
            started_at_kill.add(e.event.lineage)
        elif isinstance(e.event, WorkerEnded):
            ended_at_kill.add(e.event.lineage)
    on_victim = {lin for lin, c in placed.items() if c == VICTIM} - ended_at_kill
    running = on_victim & started_at_kill
    waiting = on_victim - started_at_kill
    assert running, "the victim ran nothing when it was killed"
    assert waiting, "the victim had nothing queued when it was killed"

    ends = {e.event.lineage: e for e in history if isinstance(e.event, WorkerEnded)}
    # Its started workers were failed, each within the liveness period (and the time a
    # peer takes to notice and journal it) of the kill.
    for lineage in running:
        end = ends[lineage]
        assert end.event.outcome == "lost", (lineage, end.event)
        late_ms = end.recorded_at.timestamp() * 1000 - killed_ms
        assert late_ms <= CLAIM_S * 1000 + 3000, (lineage, late_ms)
    # Its workers that had not started moved to the survivors, and ran there (unless a
    # lost parent's end killed them first).
    final_cell: dict[str, str] = {}
    for e in history:
        if isinstance(e.event, WorkerScheduled):
            final_cell[e.event.lineage] = e.event.cell
    lost_parents = {lin for lin in running if lin.count("/") == 1}
    moved = {lin for lin in waiting if final_cell[lin] != VICTIM}
    assert moved == waiting
    ran_moved = {lin for lin in moved if ends[lin].event.outcome == "exited"}
    outcomes = Counter(
        (ends[lin].event.outcome, ends[lin].event.reason[:80], lin.rpartition("/")[0] in running)
        for lin in moved
    )
    assert ran_moved, f"no moved worker ran on a survivor: {outcomes}"
    results = {p["lineage"]: p for _, kind, p, _ in payloads if kind == "WorkerResult"}
    for lin in moved - ran_moved:
        parent = lin.rpartition("/")[0]
        assert parent in lost_parents | running, (
            lin,
            ends[lin].event,
            ends.get(parent),
            results.get(parent),
        )

    # Every other worker finished: exited; a coordinator whose children were lost was
    # told (its wait answered with their status).
    def story(lineage: str) -> list[str]:
        return [
            f"{e.position} {e.event.type_name} {e.event.payload()}"[:2000]
            for e in history
            if getattr(e.event, "lineage", None) == lineage
        ]

    for lineage, end in ends.items():
        parent = lineage.rpartition("/")[0]
        doomed = lineage in running or parent in lost_parents | running
        if not doomed and (end.event.outcome, end.event.exit_code) != ("exited", 0):
            pytest.fail(f"{lineage} ended {end.event}; its parent: " + "\n".join(story(parent)))
    told = 0
    results = {p["lineage"]: p for _, kind, p, _ in payloads if kind == "WorkerResult"}
    for lineage in {lin for lin in ends if lin.count("/") == 1} - running:
        kids = [lin for lin in ends if lin.rpartition("/")[0] == lineage]
        if any(k in running for k in kids):
            assert lineage in results, f"{lineage} was never told its children were lost"
            told += 1
            assert "lost" in results[lineage]["text"], results[lineage]
    # No worker ran twice: one start each in the journal, one line each in its own log.
    starts = Counter(e.event.lineage for e in history if isinstance(e.event, WorkerStarted))
    assert max(starts.values()) == 1
    runs = Counter()
    for lineage in starts:
        out = log_dir(state_dir, lineage) / "stdout"
        if out.exists():
            runs[lineage] = out.read_text().count("ran")
    assert runs
    assert max(runs.values()) == 1
    assert all(runs[lin] == 1 for lin, end in ends.items() if end.event.outcome == "exited")
    # Leases and slots returned; the journal's own checks and the independent folds.
    assert check_history(payloads).problems == []
    assert check_workers(payloads).problems == []
    assert check_settled(payloads).problems == []
    with Charter.open(url, keys=KeyStore(home)) as charter:
        view = ResourceView()
        view.refresh(charter.journal)
        live_leases = [x.lineage for x in view.book.ledgers() if x.parent and x.active(now_ms())]
        assert live_leases == []
        victim = view.cells.get(VICTIM)
        assert all(not held for held in victim.holders.values())
    assert told > 0, "no parent on a live cell had a child lost with the victim"
    audit = _cli(url, home, state_dir, "--json", "audit")
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-2000:]
    verify = _cli(url, home, state_dir, "journal", "verify")
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    print(
        f"\nfabric: {len(ends)} workers, {len(running)} lost with {VICTIM}, {len(moved)} moved "
        f"({len(ran_moved)} ran), {told} parents told, load {_load()}"
    )


def test_two_cells_of_two_classes_each_run_their_own_classes_workers(
    pg_url: str, tmp_path: Path, state_dir: Path
) -> None:
    """Two ``cell run`` processes, one ``--class gpu``, one ``--class cpu --class io``,
    on one PostgreSQL journal: a fan-out asking each class runs every worker on the
    cell of its class (the journal's starts and each worker's own stdout log say so),
    one asking neither runs on both, and ``charter audit`` (``cell-claim``) is clean."""
    home = tmp_path / "home"
    classes = {"g": ("--class", "gpu"), "c": ("--class", "cpu", "--class", "io")}
    _fabric(
        pg_url,
        home,
        Ceiling(budget=ROOT, depth=2, fanout=40),
        CellSetup(cores=4, processing=3, coordination=4),
        tuple(classes),
    )
    procs = {name: _cell(pg_url, home, state_dir, name, *opts) for name, opts in classes.items()}
    try:
        with Charter.open(pg_url, keys=KeyStore(home)) as charter:
            journal = charter.journal

            def started() -> set[str]:
                return {e.event.cell for e in journal.entries(types=["CellStarted"])}

            _wait("two cells to start", lambda: started() >= set(classes), 60, list(procs.values()))
            cost = Budget.parse("tokens=60k,wall=6m,cpu=60s,mem=1536MiB,egress=0MB")
            echo = WorkerSpec(argv=("/bin/sh", "-c", "echo ran"))
            asked: dict[str, list[str]] = {}
            # Unclassed first: both cells have the same room then, so ties by id split it.
            for klass in (None, "gpu", "io"):
                intent = SpawnIntent.model_validate(
                    {"width": 6, "objective": f"echo on a cell of class {klass}",
                     "estimated_cost": cost}
                )  # fmt: skip
                spec = echo.model_copy(update={"cell_class": klass})
                result = charter.spawn(
                    "agent:estate", intent, policy=FixedPolicy(Verdict.POSITIVE), workers=(spec,)
                )
                asked[str(klass)] = [str(c.lineage) for c in result.children]
            everyone = {lin for kids in asked.values() for lin in kids}

            def ended() -> set[str]:
                return {e.event.lineage for e in journal.entries(types=["WorkerEnded"])}

            _wait("every worker to end", lambda: ended() >= everyone, 60, list(procs.values()))
            ran_on = {
                e.event.lineage: e.event.cell
                for e in journal.entries(types=["WorkerStarted"])
                if isinstance(e.event, WorkerStarted)
            }
            outcomes = {
                e.event.lineage: e.event.outcome
                for e in journal.entries(types=["WorkerEnded"])
                if isinstance(e.event, WorkerEnded)
            }
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(timeout=60)
            assert p.returncode == 0, p.stderr.read().decode()[-2000:] if p.stderr else ""
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert {outcomes[lin] for lin in everyone} == {"exited"}
    assert {ran_on[lin] for lin in asked["gpu"]} == {"g"}
    assert {ran_on[lin] for lin in asked["io"]} == {"c"}
    assert {ran_on[lin] for lin in asked["None"]} == {"g", "c"}  # the positive control
    for lin in everyone:  # each ran once, in its own sandbox (its log on this host)
        assert (log_dir(state_dir, lin) / "stdout").read_text().count("ran") == 1
    audit = _cli(pg_url, home, state_dir, "--json", "audit")
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-2000:]
