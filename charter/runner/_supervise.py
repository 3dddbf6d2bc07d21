"""The cell's supervision: one sampler thread per cell, baselines learned from the
workers that completed, and the canaries of every sandbox (docs/supervision.md).

Every ``SAMPLE_INTERVAL_S`` the sampler takes one pass over the cell's live workers:
each is sampled from the host (:func:`charter.sandbox.sample_signals`, plus the door's
counts of its calls), mapped to an :class:`~charter.supervision.Observation`, held
against its task class's baseline under the operator's policy (``decide``), and any
verdict is appended pinned to ``supervise:<lineage>``: committed before anyone acts on
it (the cell's follower acts on the committed entry, whoever wrote it). It produces
verdicts; it never acts on one.

At a worker's end its profile (the peak of its samples) is queued, and the sampler
appends ``WorkerProfiled`` with the ``BaselineChanged`` it teaches (none unless it
completed: exited with code 0) in one append pinned to ``baseline:<task class>``.

Each sandbox gets its canaries at lease, before its worker's first instruction: the
decoy credential file planted in its workspace and watched by the cell's one
:class:`~charter.sandbox.CanaryWatch`, the decoy secret name (asked of the door's
``secret`` call) and the decoy egress destination (checked against the broker's
attempts on every pass). A touch is a quarantine verdict naming the canary, appended at
once (on the watch's thread, the door's, or the sampler's).
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from charter.core import now_ms
from charter.ledger import AppendConflictError, Journal
from charter.runner.errors import SupervisionPolicyError
from charter.sandbox import (
    OVERFLOW,
    CanaryWatch,
    DecoyTouch,
    EgressBroker,
    Slot,
    plant_decoy,
    sample_signals,
)
from charter.sandbox.spec import SandboxSpec
from charter.supervision import (
    LEARNED_OUTCOME,
    Baseline,
    BaselineChanged,
    CanariesPlanted,
    CanaryKind,
    CanarySet,
    CanaryTouch,
    Observation,
    Signals,
    Supervised,
    SupervisionPolicy,
    Verdict,
    WorkerProfiled,
    WorkerSampled,
    baseline_stream,
    canaries_for,
    decide,
    learn,
    observe,
    supervise_stream,
    supervised_after,
    touched,
)

__all__ = [
    "BURN_EVERY_S",
    "POLICY_FILE",
    "SAMPLE_INTERVAL_S",
    "Supervisor",
    "fold_baselines",
    "load_policy",
    "profile_outcome",
]

SAMPLE_INTERVAL_S = 0.25
"""One pass over every live worker of the cell starts at most this long after the last
one started (a pass longer than this starts the next at once): each live worker is
sampled at least every ``SAMPLE_INTERVAL_S`` plus one pass's duration."""

POLICY_FILE = "supervision.json"
"""The operator's supervision policy, in the Charter home (absent: the defaults)."""

BURN_EVERY_S = 2.0
"""A live worker's usage so far is journaled (``WorkerSampled``) at most once every
``BURN_EVERY_S`` of its life, from its latest sample, and never in its first
``BURN_EVERY_S``: one entry of about 300 bytes per live worker per 2 s at most."""

LEARN_EVERY_S = 1.0
"""The profiles of ended workers are journaled (with the baselines they teach) at most
once every ``LEARN_EVERY_S``, each class's in one append, and at the cell's close: one
append per class per second at most, not one per pass (a baseline is used only from
the next pass on, so a second's batch decides exactly as a pass's would)."""

RATE_SETTLED_MS = 1000
"""A life-average rate in a worker's first moments is noise (a few ms of start-up over
a few ms of life reads as several cores): a profile takes ``cpu_permille`` only from
samples at least this old, and from its final sample (its whole life's average)."""

_SAMPLES_KEPT = 64  # sample times kept per worker (the interval's evidence)
_APPEND_TRIES = 5  # a pinned append that lost a race, decided again on a fresh read


def load_policy(home: Path) -> SupervisionPolicy:
    """The policy ``<home>/supervision.json`` states; the defaults when it is absent.
    A file that is not a valid policy is bad input naming the field."""
    path = home / POLICY_FILE
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return SupervisionPolicy()
    except OSError as e:
        raise SupervisionPolicyError(f"{path}: cannot be read: {e.strerror}") from None
    try:
        return SupervisionPolicy.from_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(the document)"
        raise SupervisionPolicyError(f"{path}: field {where}: {first['msg']}") from None


def profile_outcome(outcome: str, exit_code: int | None) -> str:
    """The outcome a profile records: the supervision package's ``completed`` is the
    cell's ``exited`` with exit code 0; any other end is recorded as the cell's outcome
    (``exited`` with another code, ``killed``, ``timed_out``…) and teaches nothing."""
    return LEARNED_OUTCOME if outcome == "exited" and exit_code == 0 else outcome


def fold_baselines(changes: Iterable[BaselineChanged]) -> dict[str, Baseline]:
    """Each task class's newest baseline among ``changes`` (its highest version)."""
    out: dict[str, Baseline] = {}
    for change in changes:
        old = out.get(change.task_class)
        if old is None or change.version > old.version:
            out[change.task_class] = Baseline.from_event(change)
    return out


@dataclass
class _Watched:
    """One leased sandbox under supervision."""

    lineage: str
    task_class: str
    spec: SandboxSpec
    canaries: CanarySet
    started: float  # monotonic, at lease
    wd: int | None = None
    profile: Signals = field(default_factory=Signals)
    active: bool = True  # False: nothing more is decided or reported on it
    # Its standing folded from every verdict committed on it, in journal order, whoever
    # appended it (None: killed or quarantined); the cell's follower folds them
    # (:meth:`Supervisor.committed`). ``pending``: this process's own verdicts appended
    # and not folded yet (position, verdict); ``seen``: the verdicts of its stream
    # folded so far (its stream's version, a quarantine's digest aside).
    base: Supervised | None = field(default_factory=Supervised)
    pending: list[tuple[int, Verdict]] = field(default_factory=list)
    seen: int = 0
    last: Observation | None = None
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=_SAMPLES_KEPT))
    burnt: float = 0.0  # its age (s) at its last WorkerSampled

    def state(self) -> Supervised | None:
        """Where it stands: the committed verdicts folded, then its own pending ones."""
        state = self.base
        for _, verdict in self.pending:
            if state is None:
                return None
            state = supervised_after(state, verdict)
        return state


class Supervisor:
    """The supervision of one cell process: call :meth:`plant` at each lease,
    :meth:`ended` at each end, :meth:`door_call` and :meth:`secret_asked` from the
    door, :meth:`close` at the cell's close."""

    def __init__(
        self,
        journal: Journal,
        lock: threading.RLock,
        policy: SupervisionPolicy,
        *,
        egress: EgressBroker | None,
        held: Callable[[str], bool],
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        self.journal = journal
        self.lock = lock  # the views' lock: every append of the process is made under it
        self.policy = policy
        self.egress = egress
        self.held = held  # whether a lineage's start committed and its sandbox is held
        self.interval_s = interval_s
        with lock:
            self.baselines = self._read_baselines()  # each class's newest, read at _versions
        self._versions: dict[str, int] = {}  # the baseline stream version each is read at
        self._watched: dict[str, _Watched] = {}
        self._counts: dict[str, dict[str, int]] = {}
        self._profiles: list[WorkerProfiled] = []
        self._mu = threading.Lock()  # the three dicts above
        self.verdicts: list[Verdict] = []  # committed by this process, in order
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self.watch = CanaryWatch(self._on_touch)
        self._thread = threading.Thread(target=self._run, name="supervise", daemon=True)
        self._thread.start()

    def _read_baselines(self) -> dict[str, Baseline]:
        entries = self.journal.entries(types=(BaselineChanged.type_name,))
        return fold_baselines(e.event for e in entries if isinstance(e.event, BaselineChanged))

    # -- the cell's hooks -------------------------------------------------------------

    def plant(self, lineage: str, slot: Slot, task_class: str) -> CanariesPlanted:
        """``slot`` was leased for ``lineage`` (its worker has not run): plant and watch
        its decoy file; return the ``CanariesPlanted`` to journal with its start. Raises
        ``SandboxUnavailableError`` when the decoy cannot be planted (no start)."""
        canaries = canaries_for(slot.sandbox_id, secrets.token_bytes(16))
        w = _Watched(lineage, task_class, slot.spec, canaries, time.monotonic())
        with plant_decoy(slot.spec, canaries.credential_file, canaries.credential_text()) as d:
            with self._mu:
                self._watched[lineage] = w
            w.wd = self.watch.watch(lineage, d)
        return canaries.planted(lineage)

    def forget(self, lineage: str) -> None:
        """``lineage``'s sandbox is gone without an end to profile (never started)."""
        with self._mu:
            w = self._watched.pop(lineage, None)
            self._counts.pop(lineage, None)
        if w is not None and w.wd is not None:
            self.watch.unwatch(w.wd)

    def exited(self, lineage: str) -> None:
        """``lineage``'s worker exited (its cgroup's counters are final, its sandbox not
        destroyed yet): its last sample, and its decoy's watch removed now, well before
        its workspace is unmounted (an unmount waits for the kernel to reap removed
        watches, so a watch removed only just before it delays every sandbox's
        teardown)."""
        with self._mu:
            w = self._watched.get(lineage)
        if w is None:
            return
        self._sample(w, decide_too=False)
        self.stand_down(lineage)

    def stand_down(self, lineage: str) -> None:
        """Nothing more is decided or reported on ``lineage``: it exited, or Charter
        itself is about to read its workspace (a quarantine's digest opens the decoy
        too, from the host, while the sandbox is frozen: that open is no worker's)."""
        with self._mu:
            w = self._watched.get(lineage)
        if w is None:
            return
        w.active = False
        if w.wd is not None:
            self.watch.unwatch(w.wd)
            w.wd = None

    def ended(self, lineage: str, outcome: str, exit_code: int | None) -> None:
        """``lineage``'s worker ended: its profile (its samples' peak, the last taken
        at :meth:`exited`) is queued for the sampler to journal with what it teaches."""
        with self._mu:
            w = self._watched.get(lineage)
        if w is None:
            return
        self.forget(lineage)
        profiled = WorkerProfiled(
            lineage=lineage,
            task_class=w.task_class,
            outcome=profile_outcome(outcome, exit_code),
            profile=w.profile,
        )
        with self._mu:
            self._profiles.append(profiled)

    def door_call(self, lineage: str, method: str, size: int) -> None:
        """The door was asked ``method`` by ``lineage`` (``size``: a spawn's width, a
        result's bytes)."""
        with self._mu:
            c = self._counts.setdefault(lineage, {})
            match method:
                case "spawn":
                    c["spawn_calls"] = c.get("spawn_calls", 0) + 1
                    c["spawn_width"] = max(c.get("spawn_width", 0), size)
                case "sign":
                    c["sign_calls"] = c.get("sign_calls", 0) + 1
                case "result":
                    c["result_bytes"] = c.get("result_bytes", 0) + size

    def committed(self, verdicts: list[tuple[int, Verdict]]) -> None:
        """Verdicts committed on the journal (by anyone: an operator, another decider,
        this process), each with its position, in journal order: each one on a worker
        watched here, in its sandbox, is folded into its standing (call under the views'
        lock, which every append of the process holds)."""
        with self._mu:
            watched = dict(self._watched)
        for position, verdict in verdicts:
            w = watched.get(verdict.lineage)
            if w is None:
                continue
            w.seen += 1
            w.pending = [(p, v) for p, v in w.pending if p != position]
            if w.base is not None and verdict.sandbox_id == w.spec.sandbox_id:
                w.base = supervised_after(w.base, verdict)

    def secret_asked(self, lineage: str, name: str) -> None:
        """``lineage`` asked the door for secret ``name``: its decoy's name is a touch."""
        self._touch(lineage, "secret_name", name)

    def observation(self, lineage: str) -> Observation | None:
        """``lineage``'s latest sample (None: not sampled yet, or ended)."""
        with self._mu:
            w = self._watched.get(lineage)
        return None if w is None else w.last

    def sample_times(self, lineage: str) -> list[float]:
        """The monotonic times of ``lineage``'s last samples (while it is live)."""
        with self._mu:
            w = self._watched.get(lineage)
            return [] if w is None else list(w.samples)

    def close(self) -> None:
        """Stop sampling; journal the profiles still queued; stop the watch."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._learn_queued()
        self.watch.close()

    # -- the sampler ------------------------------------------------------------------

    def _run(self) -> None:
        wait = self.interval_s
        learnt = time.monotonic()
        while not self._stop.wait(wait):
            began = time.monotonic()
            try:
                with self._mu:
                    live = list(self._watched.values())
                for w in live:
                    if self.held(w.lineage):
                        self._sample(w, decide_too=True)
                if began - learnt >= LEARN_EVERY_S:
                    learnt = began
                    self._learn_queued()
            except Exception as e:  # noqa: BLE001 - the sampler outlives one failed pass
                self._failed(e)
            wait = max(0.0, self.interval_s - (time.monotonic() - began))

    def _failed(self, e: BaseException) -> None:
        self.failures.append(e)
        del self.failures[:-16]
        print(f"charter supervision: {type(e).__name__}: {e}", file=sys.stderr)

    def _sample(self, w: _Watched, *, decide_too: bool) -> None:
        s = sample_signals(w.spec, egress=self.egress)
        with self._mu:
            counts = dict(self._counts.get(w.lineage, {}))
        obs = observe(
            lineage=w.lineage, sandbox_id=w.spec.sandbox_id, task_class=w.task_class,
            at_ms=now_ms(), wall_ms=int((time.monotonic() - w.started) * 1000),
            cpu_ms=s.cpu_ms, cpu_throttled_ms=s.cpu_throttled_ms,
            memory_bytes=s.memory_peak_bytes, memory_failcnt=s.memory_failcnt,
            pids_limit_hits=s.pids_limit_hits, egress_attempts=s.egress_attempts,
            egress_refusals=s.egress_refusals, workspace_bytes=s.workspace_bytes, **counts,
        )  # fmt: skip
        w.last = obs
        settled = obs.signals
        if decide_too and obs.wall_ms < RATE_SETTLED_MS:  # not the final sample
            settled = settled.model_copy(update={"cpu_permille": 0})
        w.profile = w.profile.peak(settled)
        w.samples.append(time.monotonic())
        if not decide_too:
            return
        self._burn(w, obs)
        state = w.state()
        if not w.active or state is None:
            return
        if self.egress is not None and s.egress_attempts:
            for attempt in self.egress.attempts(w.spec.host_uid):
                if w.canaries.match("egress_destination", attempt.destination):
                    self._touch(w.lineage, "egress_destination", attempt.destination)
                    return
        verdict = decide(
            obs, self.baselines.get(w.task_class), self.policy,
            standing=state.standing, accepted=state.levels(),
        )  # fmt: skip
        if verdict is not None:
            self._commit(w, verdict, retry=False)

    def _burn(self, w: _Watched, obs: Observation) -> None:
        """Journal ``w``'s usage so far when its last was ``BURN_EVERY_S`` ago."""
        age = obs.wall_ms / 1000
        if age - w.burnt < BURN_EVERY_S:
            return
        w.burnt = age
        sampled = WorkerSampled(
            lineage=w.lineage, sandbox_id=w.spec.sandbox_id, wall_ms=obs.wall_ms,
            cpu_ms=obs.signals.cpu_ms, memory_bytes=obs.signals.memory_bytes,
        )  # fmt: skip
        with self.lock:
            self.journal.append([sampled])

    # -- canaries ---------------------------------------------------------------------

    def _on_touch(self, touch: DecoyTouch) -> None:
        """The watch saw a decoy opened (on the watch's thread). An overflow lost
        events: every watched sandbox may have been touched (fail closed)."""
        try:
            self._touched(touch)
        except Exception as e:
            self._failed(e)  # reported; the watch goes on
            raise

    def _touched(self, touch: DecoyTouch) -> None:
        if touch.kind == OVERFLOW:
            with self._mu:
                every = list(self._watched)
            for lineage in every:
                self._touch(lineage, "credential_file", None)
            return
        self._touch(touch.key, "credential_file", None)

    def _touch(self, lineage: str, kind: CanaryKind, value: str | None) -> None:
        """A quarantine at once if ``value`` (None: the decoy file itself) is one of
        ``lineage``'s canaries of ``kind``."""
        with self._mu:
            w = self._watched.get(lineage)
        if w is None or not w.active or w.state() is None:
            return  # not ours, ended, or already being killed
        seen = CanaryTouch(
            sandbox_id=w.spec.sandbox_id, kind=kind,
            value=w.canaries.credential_file if value is None else value, at_ms=now_ms(),
        )  # fmt: skip
        verdict = touched(
            w.canaries, seen, lineage=lineage, task_class=w.task_class,
            policy_version=self.policy.version,
        )  # fmt: skip
        if verdict is not None:
            self._commit(w, verdict, retry=True)

    # -- appends ----------------------------------------------------------------------

    def _commit(self, w: _Watched, verdict: Verdict, *, retry: bool) -> None:
        """Append ``verdict`` pinned to the worker's verdict stream. A behaviour verdict
        that lost a race, or was decided on a standing that misses a verdict someone
        else committed (its stream is past what was folded), is decided again at the
        next pass, once the follower has folded it; a quarantine is tried again at
        once."""
        stream = supervise_stream(w.lineage)
        for _ in range(_APPEND_TRIES if retry else 1):
            with self.lock:
                if not w.active or w.state() is None:
                    return
                version = self.journal.stream_version(stream)
                if not retry and version > w.seen + len(w.pending):
                    return  # decided on a stale standing: again at the next pass
                try:
                    committed = self.journal.append([verdict], expect={stream: version})
                except AppendConflictError:
                    continue
                w.pending.append((committed[0].position, verdict))
                self.verdicts.append(verdict)
                return

    def _learn_queued(self) -> None:
        """Journal the queued profiles, each class's in one append pinned to its
        baseline stream, with the versions they teach."""
        with self._mu:
            queued, self._profiles = self._profiles, []
        by_class: dict[str, list[WorkerProfiled]] = {}
        for p in queued:
            by_class.setdefault(p.task_class, []).append(p)
        for task_class, profiles in by_class.items():
            self._learn(task_class, profiles)

    def _learn(self, task_class: str, profiles: list[WorkerProfiled]) -> None:
        """Pinned to the version of ``baseline:<task_class>`` the cached baseline was
        read at: a version another writer moved makes the append conflict, and the
        baseline is read again (its stream's version first, then its entries: an entry
        newer than that version makes the next try conflict too)."""
        stream = baseline_stream(task_class)
        for _ in range(_APPEND_TRIES):
            if task_class not in self._versions:
                with self.lock:
                    self._versions[task_class] = self.journal.stream_version(stream)
                    fresh = self._read_baselines().get(task_class)
                if fresh is not None:
                    self.baselines[task_class] = fresh
            version = self._versions[task_class]
            # What they teach is worked out off the lock (the pin makes the append fail
            # if the stream moved meanwhile); only the append is made under it.
            baseline = self.baselines.get(task_class) or Baseline.empty(task_class)
            events: list[WorkerProfiled | BaselineChanged] = []
            for p in profiles:
                events.append(p)
                change = learn(baseline, p)
                if change is not None:
                    events.append(change)
                    baseline = Baseline.from_event(change)
            try:
                with self.lock:
                    self.journal.append(events, expect={stream: version})
            except AppendConflictError:  # another writer taught it: read it again
                del self._versions[task_class]
                continue
            self._versions[task_class] = version + len(events)
            if baseline.version:
                self.baselines[task_class] = baseline
            return
        self._failed(RuntimeError(f"profiles of {task_class} not journaled: {stream} raced"))
