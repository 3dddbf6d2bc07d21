"""The commit window (issue: read skew), at every append kind a budget decision makes.

A batch is stamped under the journal's write lock and its COMMIT comes later (a slow
fsync, a large group commit, a stalled leader): tests/budgets/_slow.py holds it open for
HOLD_S after its stamp. In each scenario, one append of a kind is held while a racing
fan-out is decided on what the journal shows in that window, around a lease's expiry:

- usage: a child's usage stamped just before the child's end; the parent fans out just
  after it, needing the child's budget. Guarded by settled time: the expiry is not
  final until the journal has committed past it (``LeaseBook.remaining(…,
  settled_ms)``), unless the fan-out's append pins the journal's head as it read it
  (``Journal.append(expect_head=…)``): its first try does, loses to the usage's commit,
  and the try after it settles the journal (a ``BudgetSettled`` commit) and reads the
  usage.
- release: a child's release; the child fans out in the window, and the grandchild it
  would mint spends. Guarded by the pins: the fan-out is pinned to the child's stream.
- renew: the renewal, just before its end, of a lease granted without a grant digest
  (as an older journal holds: a spawned lease ends with its grant, so its renewals are
  refused before anything is appended, see test_lease_refusals); the parent fans out
  just after the old end. Guarded by both: settled time counts the expiry as not final,
  and the renewal is on the parent's stream, which the fan-out pins.
- fanout: the parent's fan-out stamped just before a child's end; a second fan-out of
  the parent just after it. Guarded by both: the pins on the parent's stream (the
  second is decided again once the first commits), and settled time (the child's
  expiry is not final, so the decision settles the journal first, which waits for the
  first fan-out's commit and reads it).

Both backends; the independent fold (tests/invariants.py) checks every position. The
controls: the head pin dropped from the fan-out's append (the usage scenario); and the
guards named above switched off (test-side: the rule's book method and the
pins ``Journal.append`` is given), lets the racing decision through, and the fold
reports the parent overspent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from charter.budgets import LeaseBook, LeaseEndedError, LeaseGranted, UsageRecorded
from charter.control import BudgetService, Caller, SpawnService
from charter.core import Budget, KeyStore, RefusedError, now_ms
from charter.ledger import Journal
from tests.invariants import check_history, journal_history

from . import _slow
from ._support import ceiling, intent, register_root, service, watch_fan_outs

HOLD_S = 3.0  # how long a held batch's commit waits after its stamp (the window)
ROOT = Budget.parse("tokens=100k,wall=10h,cpu=10h,mem=64GiB,egress=10GB")
SPENT = Budget.parse("tokens=100k,wall=0s,cpu=0s,mem=0B,egress=0B")
LATER = Budget.parse("tokens=100k,wall=1m,cpu=1m,mem=1GiB,egress=0")  # the racing ask
BRIEF = Budget.parse("tokens=100k,wall=2s,cpu=1h,mem=1GiB,egress=1GB")  # ends in ~2 s
STAMP_BEFORE_END_MS = 400  # the held append is stamped this long before the expiry
DECIDE_AFTER_END_MS = 300  # the racing fan-out is decided this long after it
WAIT_S = 20.0  # for a condition (the hold to start), never a fixed sleep


@dataclass
class Scene:
    url: str
    home: Path
    journal: Journal
    svc: SpawnService
    root: Caller

    def slow(self) -> Journal:
        """The same journal through a recorder that holds batches open (_slow.py)."""
        return Journal.open(self.url, env=_slow.env(self.url))


def _scene(url: str, home: Path) -> Scene:
    keys = KeyStore(home)
    journal = Journal.create(url)
    register_root(journal, keys, "root", ceiling(ROOT))
    svc = service(journal, keys)
    return Scene(url, home, journal, svc, svc.durable_caller("root"))


def _until(ms: int) -> None:
    while now_ms() < ms:  # a wall-clock instant the scenario is built around
        time.sleep(0.005)


def _in_window() -> None:
    if not _slow.held.wait(WAIT_S):
        raise AssertionError("the held append never started")


def _in_background(work: Callable[[], Any]) -> Callable[[], None]:
    """Run ``work`` in a thread; the returned join re-raises what it raised."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # handed to the test by join()
            failure.append(e)

    thread = threading.Thread(target=run)
    thread.start()

    def join() -> None:
        thread.join()
        if failure:
            raise failure[0]

    return join


def _race(decide: Callable[[], Any]) -> str | None:
    """The racing decision: None if it went through, else its refusal's name."""
    try:
        decide()
    except RefusedError as refused:
        return type(refused).__name__
    return None


def _usage(scene: Scene) -> str | None:
    """A child holding the root's whole budget spends it all, stamped just before its
    end; the root fans out again just after the end, in the window."""
    svc, root = scene.svc, scene.root
    child = str(svc.spawn(root, intent(1, BRIEF)).children[0].lineage)
    expires = svc.resources.book.get(child).expires_at_ms or 0
    _slow.configure(["UsageRecorded"], HOLD_S)
    with scene.slow() as slow:

        def spend() -> None:
            _until(expires - STAMP_BEFORE_END_MS)
            BudgetService(slow).record_usage(child, SPENT)

        join = _in_background(spend)
        _until(expires + DECIDE_AFTER_END_MS)
        _in_window()
        refused = _race(lambda: svc.spawn(root, intent(1, LATER)))
        join()
    if refused is None:  # the new child spends what it was lent
        BudgetService(scene.journal).record_usage(_last_lease(scene.journal), SPENT)
    return refused


def _release(scene: Scene) -> str | None:
    """A child holding the root's whole budget is released; in the window it fans out
    all it holds, and the grandchild spends it. The root leases the released budget to
    a new child once the release commits (which it may)."""
    svc, root = scene.svc, scene.root
    child = root.child(svc.spawn(root, intent(1, LATER)).children[0])
    _slow.configure(["LeaseReleased"], HOLD_S)
    with scene.slow() as slow:
        join = _in_background(lambda: BudgetService(slow).release(child.claimed))
        _in_window()
        grandchild = Budget.parse("tokens=100k,wall=30s,cpu=30s,mem=512MiB,egress=0")
        refused = _race(lambda: svc.spawn(child, intent(1, grandchild)))
        join()
    svc.spawn(root, intent(1, LATER))  # what the release returned, leased again
    if refused is None:
        grandchild_lineage = next(
            lineage
            for entry in scene.journal.entries(types=("LeaseGranted",))
            if isinstance(entry.event, LeaseGranted) and entry.event.parent == child.claimed
            for lineage in entry.event.lineages
        )
        try:
            BudgetService(scene.journal).record_usage(grandchild_lineage, SPENT)
        except LeaseEndedError:
            # The views refuse it (a lease granted under one that had ended and left
            # the book has no ledger); a writer without the checks appends it anyway.
            usage = UsageRecorded(
                lineage=grandchild_lineage, amount=SPENT, refused=Budget.zero(), exhausted=False
            )
            scene.journal.append([usage])
    return refused


def _renew(scene: Scene) -> str | None:
    """A lease granted without a grant digest (renewable) holds the root's whole
    budget; it is renewed just before its end; the root fans out just after the old
    end, in the window."""
    journal = scene.journal
    expires = now_ms() + 2_000
    legacy = LeaseGranted(
        parent="agent:root",
        lineages=("agent:root/legacy",),
        allocation=BRIEF,
        expires_at_ms=expires,
    )
    journal.append([legacy], expect={"agent:root": journal.stream_version("agent:root")})
    _slow.configure(["LeaseRenewed"], HOLD_S)
    with scene.slow() as slow:

        def renew() -> None:
            _until(expires - STAMP_BEFORE_END_MS)
            BudgetService(slow).renew("agent:root/legacy", expires + 60_000)

        join = _in_background(renew)
        _until(expires + DECIDE_AFTER_END_MS)
        _in_window()
        refused = _race(lambda: scene.svc.spawn(scene.root, intent(1, LATER)))
        join()
    return refused


def _fanout(scene: Scene) -> str | None:
    """A child holds 40 % of the root's tokens until ~2 s from now; the root fans out
    the other 60 % just before that end (held), and 60 % again just after it."""
    svc, root = scene.svc, scene.root
    sibling = BRIEF.model_copy(update={"tokens": 40_000})
    child = str(svc.spawn(root, intent(1, sibling)).children[0].lineage)
    expires = svc.resources.book.get(child).expires_at_ms or 0
    most = LATER.model_copy(update={"tokens": 60_000})
    _slow.configure(["LeaseGranted"], HOLD_S)
    with scene.slow() as slow:
        held_svc = service(slow, KeyStore(scene.home))
        held_root = held_svc.durable_caller("root")

        def first() -> None:
            _until(expires - STAMP_BEFORE_END_MS)
            held_svc.spawn(held_root, intent(1, most))

        join = _in_background(first)
        _until(expires + DECIDE_AFTER_END_MS)
        _in_window()
        refused = _race(lambda: svc.spawn(root, intent(1, most)))
        join()
    return refused


def _last_lease(journal: Journal) -> str:
    entry = list(journal.entries(types=("LeaseGranted",)))[-1]
    assert isinstance(entry.event, LeaseGranted)
    return entry.event.lineages[-1]


SCENARIOS: dict[str, Callable[[Scene], str | None]] = {
    "usage": _usage,
    "release": _release,
    "renew": _renew,
    "fanout": _fanout,
}
REFUSED = {  # what the racing decision is refused with
    "usage": "InsufficientBudgetError",
    "release": "LeaseEndedError",
    "renew": "InsufficientBudgetError",
    "fanout": "InsufficientBudgetError",
}
GUARDS = {  # what the control switches off for each
    "usage": ("settled time",),
    "release": ("pins",),
    "renew": ("settled time", "pins"),
    "fanout": ("settled time", "pins"),
}


def _switch_off(guards: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    if "settled time" in guards:  # every expiry taken as final at once (as before)
        monkeypatch.setattr(LeaseBook, "_unsettled", _slow.nothing_unsettled)
    if "pins" in guards:  # appends pinned to nothing: a moved stream is re-versioned
        append = Journal.append

        def unpinned(self: Journal, events: Any, **kwargs: Any) -> Any:
            kwargs.pop("expect", None)
            return append(self, events, **kwargs)

        monkeypatch.setattr(Journal, "append", unpinned)


def _root_problems(journal: Journal) -> list[str]:
    found = check_history(journal_history(journal))
    return [p for p in found.problems if p.split(": ", 1)[1].startswith("agent:root uses ")]


@pytest.fixture(autouse=True)
def _no_hold_after() -> Any:
    yield
    _slow.configure([], 0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", SCENARIOS)
def test_a_decision_in_the_commit_window_cannot_overspend(
    kind: str, journal_url: str, tmp_path: Path
) -> None:
    scene = _scene(journal_url, tmp_path / "home")
    with scene.journal:
        refused = SCENARIOS[kind](scene)
        assert refused == REFUSED[kind]
        found = check_history(journal_history(scene.journal))
        assert found.problems == []
        assert found.checked >= 3  # the ledger, a grant and the held entry at least
        held = list(scene.journal.entries(types=(_slow.KINDS[list(SCENARIOS).index(kind)],)))
        assert held  # the held append did commit: the window was real, nothing lost


@pytest.mark.slow
@pytest.mark.parametrize("kind", SCENARIOS)
def test_control_without_the_guards_the_fold_finds_the_overspend(
    kind: str, journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _switch_off(GUARDS[kind], monkeypatch)
    scene = _scene(journal_url, tmp_path / "home")
    with scene.journal:
        assert SCENARIOS[kind](scene) is None  # the racing decision went through
        problems = _root_problems(scene.journal)
        assert problems, check_history(journal_history(scene.journal)).problems


@pytest.mark.slow
def test_the_fan_out_in_the_window_pins_the_head_loses_and_falls_back(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usage scenario, watched: the racing fan-out needs the expired child's
    budget, so its first try takes the child's end as final and pins the journal's head
    (and a commit at or after the end). The held usage commits first (the fan-out's
    append waits for the write lock it holds), the pin loses, and the decision made
    again settles the journal, reads the usage and is refused."""
    appends = watch_fan_outs(monkeypatch)
    scene = _scene(journal_url, tmp_path / "home")
    with scene.journal:
        before = len(appends)  # the scenario's own first spawn
        refused = _usage(scene)
        racing = appends[before + 1 :]
        assert refused == "InsufficientBudgetError"
        assert len(racing) == 1  # one try, head pinned
        assert racing[0][0] is not None
        assert racing[0][1] is not None
        assert len(list(scene.journal.entries(types=("BudgetSettled",)))) == 1
        assert check_history(journal_history(scene.journal)).problems == []


@pytest.mark.slow
def test_control_with_the_head_pin_weakened_the_fold_finds_the_overspend(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race with the head pin dropped from the append (settled time and the
    stream pins still on): the fan-out that took the child's end as final commits after
    the usage it never read, and re-leases what the child spent."""
    append = Journal.append

    def head_unpinned(self: Journal, events: Any, **kwargs: Any) -> Any:
        kwargs.pop("expect_head", None)
        return append(self, events, **kwargs)

    monkeypatch.setattr(Journal, "append", head_unpinned)
    scene = _scene(journal_url, tmp_path / "home")
    with scene.journal:
        assert _usage(scene) is None  # the racing decision went through
        assert not list(scene.journal.entries(types=("BudgetSettled",)))  # no fallback
        problems = _root_problems(scene.journal)
        assert problems, check_history(journal_history(scene.journal)).problems
