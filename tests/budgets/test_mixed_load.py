"""Mixed load (SQLite and PostgreSQL): 16 processes fan out, record usage (sometimes
more than they hold), release, renew and let short leases expire, all at once, for 60 s.
The whole journal is then checked, position by position, by the independent fold in
tests/invariants.py: no live ledger's own spend plus its children's charges exceeds its
allocation, no usage commits after its lease's (or an ancestor's) end, and commit times
never decrease."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from charter.core import KeyStore, entry_ms
from charter.ledger import Journal
from tests.invariants import check_history, journal_history

from ._support import ceiling, register_root

ROOT_DIR = Path(__file__).resolve().parents[2]
PROCESSES = 16
SECONDS = 60
WAIT_S = 300  # for all of them, from the start
# Every worker reserves part of the root's fan-out allowance for good (1 + its own
# allowance), so the default ceiling's 5000 would be spent in the first seconds and
# every later root fan-out refused; the allowance has its own tests.
ROOT_FANOUT = 1_000_000


def _ended_by_expiry(history: list[tuple[int, str, dict[str, Any], datetime]]) -> list[str]:
    """Leases whose (last renewed) expiry passed before the journal's last commit, with
    no release of the lease or of an ancestor before that expiry."""
    expires: dict[str, int] = {}
    parent: dict[str, str] = {}
    released: dict[str, int] = {}
    for _, kind, p, at in history:
        if kind == "LeaseGranted":
            for lineage in p["lineages"]:
                expires[lineage], parent[lineage] = int(p["expires_at_ms"]), p["parent"]
        elif kind == "LeaseRenewed":
            expires[p["lineage"]] = int(p["expires_at_ms"])
        elif kind == "LeaseReleased":
            released.setdefault(p["lineage"], entry_ms(at))
    last = entry_ms(history[-1][3])

    def first_release(lineage: str | None) -> int | None:
        times = []
        while lineage is not None:
            if lineage in released:
                times.append(released[lineage])
            lineage = parent.get(lineage)
        return min(times, default=None)

    return [
        lineage
        for lineage, end in expires.items()
        if end < last and ((r := first_release(lineage)) is None or r > end)
    ]


@pytest.mark.slow
def test_sixteen_processes_of_mixed_load_keep_every_invariant_at_every_position(
    journal_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    with Journal.create(journal_url) as journal:
        register_root(journal, KeyStore(home), "root", ceiling(fanout=ROOT_FANOUT))
    started = time.monotonic()
    mixers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.budgets._mixer", journal_url, str(home),
             str(SECONDS), str(seed)],
            cwd=ROOT_DIR,
            env={"PYTHONPATH": str(ROOT_DIR), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(PROCESSES)
    ]  # fmt: skip
    totals: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    failures = []
    try:
        for seed, mixer in enumerate(mixers):
            wait = max(1.0, started + WAIT_S - time.monotonic())
            out, err = mixer.communicate(timeout=wait)
            if mixer.returncode != 0:
                failures.append(f"mixer {seed} exited {mixer.returncode}:\n{err[-4000:]}")
                continue
            counts = json.loads(out.strip().splitlines()[-1])
            errors.update(counts.pop("errors"))
            totals.update(counts)
    finally:
        for mixer in mixers:  # only on a timeout or a crash of this test: none linger
            if mixer.poll() is None:
                mixer.kill()
                mixer.wait()
    assert failures == [], "\n".join(failures)
    ran = time.monotonic() - started
    print(f"\n{PROCESSES} mixers, {ran:.1f} s: {dict(totals)}\nrefused: {dict(errors)}")
    for count in ("spawns", "usages", "usages_over", "releases", "renewals", "refusals"):
        assert totals[count] > 0, (count, dict(totals))

    with Journal.open(journal_url) as journal:
        history = journal_history(journal)
    kinds = Counter(kind for _, kind, _, _ in history)
    assert kinds["BudgetRefused"] > 0, kinds
    # Every lease here was spawned, so it ends with its grant: no renewal may commit,
    # and the attempts are refused by name (the positive control for the grant's bound
    # is in test_lease_refusals).
    assert kinds["LeaseRenewed"] == 0, kinds
    reasons = Counter(p["reason"] for _, kind, p, _ in history if kind == "BudgetRefused")
    assert reasons["renewal-beyond-grant"] > 0, reasons
    expired = _ended_by_expiry(history)
    assert expired, "no lease ended by expiry during the run"

    found = check_history(history)
    raced = sum(
        1
        for _, kind, p, _ in history
        if kind == "BudgetRefused" and "ended before the" in p["message"]
    )  # decided while the lease was live, refused at commit (the journal's deadline)
    print(
        f"{len(history)} entries, {found.checked} positions checked, {len(expired)} leases "
        f"ended by expiry, {raced} usages/renewals refused at commit past a deadline"
    )
    assert found.problems == [], "\n".join(found.problems[:50])
    assert found.checked > 200
