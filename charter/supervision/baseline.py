"""Baselines per task class, learned only from completed workers of that class.

A :class:`Baseline` is a fold of ``WorkerProfiled`` entries: each completed profile
adds its values to every signal's integer statistics, and a new version is published
as a ``BaselineChanged`` (which holds every statistic, so that entry alone rebuilds the
baseline). No float, no clock, no randomness: replaying the same entries in the same
order gives the same versions and the same bands, to the bit.
"""

from __future__ import annotations

from math import isqrt

from pydantic import BaseModel, ConfigDict, Field

from charter.supervision.errors import BaselineClassError
from charter.supervision.events import BandStats, BaselineChanged, WorkerProfiled
from charter.supervision.observation import Signal, Signals

__all__ = ["LEARNED_OUTCOME", "SIGMAS", "Baseline", "band_upper", "learn"]

SIGMAS = 3
"""A band reaches this many (integer) standard deviations above the mean, and never
below the largest value a completed worker of the class reached."""

LEARNED_OUTCOME = "completed"
"""The one outcome whose profile a baseline learns: a killed, crashed, timed-out or
quarantined worker is no evidence of what the class does."""


def band_upper(n: int, total: int, total_sq: int, peak: int) -> int:
    """``max(peak, total // n + SIGMAS * (isqrt(n * total_sq - total**2) // n))``."""
    if n == 0:
        return 0
    spread = isqrt(n * total_sq - total * total) // n
    return max(peak, total // n + SIGMAS * spread)


def _stats(signal: Signal, n: int, total: int, total_sq: int, peak: int) -> BandStats:
    return BandStats(
        signal=signal, n=n, total=total, total_sq=total_sq, peak=peak,
        upper=band_upper(n, total, total_sq, peak),
    )  # fmt: skip


class Baseline(BaseModel):
    """One task class's baseline at ``version`` (0: nothing learned yet)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_class: str = Field(min_length=1)
    version: int = Field(default=0, ge=0)
    completed: int = Field(default=0, ge=0)
    bands: tuple[BandStats, ...] = ()

    @classmethod
    def empty(cls, task_class: str) -> Baseline:
        return cls(
            task_class=task_class,
            bands=tuple(_stats(s, 0, 0, 0, 0) for s in Signal),
        )

    @classmethod
    def from_event(cls, event: BaselineChanged) -> Baseline:
        return cls(
            task_class=event.task_class,
            version=event.version,
            completed=event.completed,
            bands=event.bands,
        )

    def band(self, signal: Signal) -> BandStats:
        for band in self.bands:
            if band.signal is signal:
                return band
        return _stats(signal, 0, 0, 0, 0)

    def upper(self, signal: Signal) -> int:
        return self.band(signal).upper

    def within(self, signals: Signals) -> bool:
        """Every signal at or below its band's upper bound."""
        return all(signals.value(s) <= self.upper(s) for s in Signal)


def learn(baseline: Baseline, profiled: WorkerProfiled) -> BaselineChanged | None:
    """The next version of ``baseline`` once it learns ``profiled``, as the event that
    publishes it; None when the profile is not one a baseline learns (its worker did not
    complete). Raises :class:`BaselineClassError` for a profile of another class."""
    if profiled.task_class != baseline.task_class:
        raise BaselineClassError(
            f"a profile of task class {profiled.task_class!r} cannot teach the baseline of "
            f"{baseline.task_class!r}"
        )
    if profiled.outcome != LEARNED_OUTCOME:
        return None
    bands = []
    for signal in Signal:
        old = baseline.band(signal)
        value = profiled.profile.value(signal)
        bands.append(
            _stats(
                signal,
                old.n + 1,
                old.total + value,
                old.total_sq + value * value,
                max(old.peak, value),
            )
        )
    return BaselineChanged(
        task_class=baseline.task_class,
        version=baseline.version + 1,
        completed=baseline.completed + 1,
        lineage=profiled.lineage,
        bands=tuple(bands),
    )
